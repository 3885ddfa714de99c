"""Small models the tests measure in well under a second: the same shapes everywhere."""

from lessonkit.models.spec import ModelSpec

# A two-layer Llama with grouped-query attention (4 heads, 2 key/value heads).
TINY_LLAMA = ModelSpec(
    name="tiny-llama",
    family="llama",
    n_layers=2,
    hidden_size=128,
    n_heads=4,
    n_kv_heads=2,
    intermediate_size=352,
    vocab_size=1000,
)
