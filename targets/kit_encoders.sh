# Shared by the GPU kits' prepare.sh (sourced, not run): kit_encoders DIR writes the two SavedModels every kit
# checks, DIR/encoder (the demo's trained encoder) and DIR/minilm-shaped (all-MiniLM-L6-v2's layer: hidden 384,
# 12 heads, FFN 1536, GELU, learned positions, a token-type table; random weights, 2 of its 6 layers and a
# 2,048-token vocabulary: the same ops at 1/5 of the bytes). Needs TensorFlow and keras-hub.

kit_encoders() {
  python3 -c "from pe_export.encoders import task; task.load_trained_model().export('$1/encoder', verbose=False)" \
    > /dev/null 2>&1
  python3 - "$1/minilm-shaped" <<'PY' > /dev/null 2>&1
import sys
import keras
import keras_hub
keras.utils.set_random_seed(0)
keras_hub.models.BertBackbone(
    vocabulary_size=2048, num_layers=2, num_heads=12, hidden_dim=384, intermediate_dim=1536, max_sequence_length=512
).export(sys.argv[1], verbose=False)
PY
}
