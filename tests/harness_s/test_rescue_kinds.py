"""Every rescue kind in one table: its typed config, the harnesses it chooses from and its rescuer."""
import pytest
from ml_collections import ConfigDict

from hsjax import builders
from hsjax.harness_s import rescue_kinds
from hsjax.harness_s.rescue import FixedSiblings, NoRescue, RandomSiblings
from hsjax.harness_s.router import HarnessSRescuer
from hsjax.infra import experiments


def _pool():
    config = experiments.get_config("dbbench", "smoke")
    bench = builders.make_benchmark(config)
    try:
        return builders.load_pool(config, bench)
    finally:
        bench.close()


POOL = _pool()
SIBLINGS = [s.name for s in POOL.siblings]
ROUTER = experiments.load("common").router()
ROUTER.explore, ROUTER.reanchor_every = 0.0, 0


def rescue(kind, **changes):
    block = ConfigDict({"kind": kind, "k": 2, "m": 1, "siblings": (SIBLINGS[1],), "hint": "look at the schema"})
    block.update(changes)
    return block


@pytest.mark.parametrize("kind, cls", [("none", NoRescue), ("random", RandomSiblings), ("fixed", FixedSiblings),
                                       ("hint", FixedSiblings), ("harness_s", HarnessSRescuer)])
def test_every_kind_builds_its_rescuer(kind, cls):
    ctx = rescue_kinds.BuildContext(seed=3, router=ROUTER)
    assert isinstance(rescue_kinds.make_rescuer(rescue(kind), POOL, ctx), cls)


def test_the_hint_kind_rescues_under_one_hinted_base_and_the_others_under_the_siblings():
    (hint,) = rescue_kinds.rescue_config(rescue("hint")).harnesses(POOL)
    assert hint.name == "hint" and hint.direction == "hint"
    assert [s.name for s in rescue_kinds.rescue_config(rescue("random")).harnesses(POOL)] == SIBLINGS
    fixed = rescue_kinds.make_rescuer(rescue("fixed"), POOL, rescue_kinds.BuildContext())
    assert [s.name for s in fixed.choose(0, 0, None, [])] == [SIBLINGS[1]]


def test_what_each_kind_reads_and_its_errors():
    assert rescue_kinds.unread(rescue("none")) == {
        f"rescue.{k}": "rescue.kind='none' never reads it" for k in ("k", "m", "siblings", "hint")}
    assert set(rescue_kinds.unread(rescue("fixed"))) == {"rescue.k", "rescue.hint"}
    with pytest.raises(ValueError, match=r"rescue.kind='nope': expected one of 'none', 'random', 'fixed', 'hint', "
                                         r"'harness_s'"):
        rescue_kinds.make_rescuer(rescue("nope"), POOL, rescue_kinds.BuildContext())
    with pytest.raises(ValueError, match="needs the router block"):
        rescue_kinds.make_rescuer(rescue("harness_s"), POOL, rescue_kinds.BuildContext())
    with pytest.raises(ValueError, match=r"rescue.siblings names \['zz'\] not in the pool"):
        rescue_kinds.make_rescuer(rescue("fixed", siblings=("zz",)), POOL, rescue_kinds.BuildContext())
    with pytest.raises(ValueError, match="exceeds the pool size"):
        rescue_kinds.make_rescuer(rescue("random", k=len(SIBLINGS) + 1), POOL, rescue_kinds.BuildContext())
