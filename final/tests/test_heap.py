import gc
import inspect

from course.final.launch.heap import freeze_startup_heap


def test_freezing_hides_the_startup_heap_and_still_reclaims_new_garbage():
    gc.unfreeze()
    try:
        kept = [{"i": i} for i in range(50_000)]  # start-up state: lives on, tracked
        frozen = freeze_startup_heap()
        assert frozen >= len(kept)
        assert not any(o is kept for o in gc.get_objects())  # out of the collector's walk

        cycle = []
        cycle.append(cycle)  # garbage made after start-up is still collected
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()


def test_serve_makes_the_grammar_tables_then_freezes_the_heap_before_it_answers(monkeypatch):
    from course.final import cli

    order = []

    class App:
        class state:
            class grammars:
                prepare = staticmethod(lambda: order.append(("prepare", gc.get_freeze_count())))

    monkeypatch.setattr(cli, "serve_until_stopped", lambda *a, **k: order.append(("serve", gc.get_freeze_count())))
    gc.unfreeze()
    try:
        cli.ready_to_serve(App())
        cli.serve_until_stopped(App(), None, "127.0.0.1", 0, 1.0)
    finally:
        gc.unfreeze()
    assert order[0] == ("prepare", 0)  # made before the freeze, so the tables are frozen with the rest
    assert order[1][0] == "serve" and order[1][1] > 0
    assert "ready_to_serve(app)" in inspect.getsource(cli.main)  # and `serve` does it before serving


def test_prepare_makes_the_tokenizer_tables_before_any_schema(byte_tok):
    from course.final.structured import GrammarCache
    from course.s08_structured.serving.closing import CloseOnBudget

    cache = GrammarCache(byte_tok, 258, [byte_tok.eos_token_id])
    cache.narrow = CloseOnBudget()
    cache.prepare()
    info = cache.tokenizer_info()
    assert getattr(info, "_matrix", None) is not None and getattr(info, "_tokens_by_bytes", None) is not None


def test_prepare_works_when_the_tokenizer_has_more_ids_than_the_model_has_logits(byte_tok):
    from course.final.structured import GrammarCache
    from course.s08_structured.serving.closing import CloseOnBudget

    cache = GrammarCache(byte_tok, 250, [byte_tok.eos_token_id])  # fewer logits than the tokenizer's ids
    cache.narrow = CloseOnBudget()
    cache.prepare()
