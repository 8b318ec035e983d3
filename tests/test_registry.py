"""The one registry pattern behind runners and table methods."""

from __future__ import annotations

import pytest

from pe_export.errors import BadInputError
from pe_export.registry import Registry


def test_register_get_and_reject() -> None:
    shapes: Registry[type] = Registry("shape", listed_first=("auto",))

    @shapes.register("square", sides=4)
    class Square:
        pass

    @shapes.register("triangle", sides=3)
    class Triangle:
        pass

    assert shapes.names() == ["square", "triangle"] and shapes.choices() == ["auto", "square", "triangle"]
    assert shapes.get("triangle") is Triangle and (Square.name, Square.sides) == ("square", 4)
    with pytest.raises(BadInputError, match=r"^unknown shape 'circle'; expected one of: auto, square, triangle$"):
        shapes.get("circle")
    with pytest.raises(ValueError, match="shape 'square' is registered twice"):
        shapes.register("square")(type("Other", (), {}))
    assert shapes.get("square") is Square
