"""What ``--allow-lossy`` accepts: the loss of the compressed tables, and nothing else.

A file with a lossy table is judged twice. Against the float32 model as it is (the report's parity), it errs by
the table's loss plus its own (the converter's, float16's, int8's). Against the same float32 model computed
with the compressed tables (the table pipeline's graph, run in TensorFlow), it errs by its own alone: that
check must pass at the precision's tolerance for the file to be accepted. Before, ``--allow-lossy`` passed any
failure once a table was lossy (all-MiniLM-L6-v2, full int8 and an SVD table: pooled cosine 0.387 from the
int8 arithmetic, the table's own error 0.015, exit 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pe_export.parity.result import OutputMetrics


def against_lossy_tables(job: Any, runner_name: str, path: Path) -> list[OutputMetrics]:
    """The staged file at ``path`` against the float32 model with the compressed tables, on the check's
    inputs, each output at the export's tolerance."""
    from pe_export.graphdef import concrete_from_graph_def
    from pe_export.native import import_tensorflow
    from pe_export.parity.bundle import Batch
    from pe_export.parity.compare import compare_batches
    from pe_export.runners import create_runner

    tf = import_tensorflow()
    prepared = job.prepared
    bound = job.frozen.weights.bind(prepared.graph_def("tflite"))  # the tables rebuilt from their compressed form
    concrete, _holder = concrete_from_graph_def(bound, prepared.inputs, prepared.outputs)
    del bound
    feeds, valid = job.check_feeds()
    batches = []
    for index, case in enumerate(feeds):
        feed = feeds[case]
        outputs = concrete(*[tf.constant(feed[name]) for name in prepared.inputs.values()])
        batches.append(Batch(index, feed, {k: np.asarray(v) for k, v in outputs.items()}, valid[case], case=case))
    tolerances = {name: job.options.tolerance for name in sorted(batches[0].outputs)}
    with create_runner(runner_name, path) as candidate:
        return compare_batches(
            candidate, batches, tolerances, model_name=job.output.name, sequence_outputs=job.sequence_outputs
        )
