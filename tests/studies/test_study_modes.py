"""The registration hook of run.py: the studies' modes are their own names, each a module with `main`."""
import importlib

import studies

LIBRARY_MODES = ("train", "eval", "evolve", "rank1", "serve", "export")


def test_study_modes_take_no_library_mode_name_and_each_has_a_main():
    assert set(studies.MODES) == {"sft", "copy_base", "probe", "testbed_demo", "testbed_gates"}
    assert not set(studies.MODES) & set(LIBRARY_MODES)
    for mode, module in studies.MODES.items():
        assert module.startswith("studies."), mode
        assert callable(importlib.import_module(module).main), mode
