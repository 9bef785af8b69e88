import gc

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
    """`serve` itself, its model and server faked: the tables are made unfrozen, then the heap is
    frozen, then the server answers."""
    from types import SimpleNamespace

    from course.final import cli
    from course.final.security.options import door_from_args

    order = []
    grammars = SimpleNamespace(prepare=lambda: order.append(("prepare", gc.get_freeze_count())))
    door = door_from_args(cli.make_parser()[0].parse_args(["serve"]))  # no key, as `serve` alone has
    app = SimpleNamespace(state=SimpleNamespace(grammars=grammars, door=door))
    engine = SimpleNamespace(start=lambda: order.append(("start", gc.get_freeze_count())))
    monkeypatch.setattr(cli, "build_server", lambda args, tp=None: (engine, app))
    monkeypatch.setattr(cli, "serve_until_stopped", lambda *a, **k: order.append(("serve", gc.get_freeze_count())))
    gc.unfreeze()
    try:
        assert cli.main(["serve"]) == 0
    finally:
        gc.unfreeze()
    assert [step for step, _ in order] == ["start", "prepare", "serve"]
    assert order[1][1] == 0  # made before the freeze, so the tables are frozen with the rest
    assert order[2][1] > 0   # answering with the start-up heap out of the collector's walk


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
