"""Mixed steps on a graph: prefill chunks, decodes and verifications captured in token-count
buckets beside the lesson's decode buckets (runner.py), and the torch backend's sync-free
attention for such steps (varlen_gather.py)."""


def register() -> None:
    """Plug the room into the lesson: the engine option `graph_max_num_tokens` (a graph runner
    with token buckets in the lesson's place) and the torch backend's captured ragged attention."""
    from ..engine import register_extension
    from ..torch_backend import register_captured_varlen
    from .runner import MixedGraphs
    from .varlen_gather import varlen_attention_gather

    register_extension("mixed_graphs", MixedGraphs.of)
    register_captured_varlen(varlen_attention_gather)
