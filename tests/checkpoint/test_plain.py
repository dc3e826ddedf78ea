"""The checkpoint state as plain data (``pc_megatron/checkpoint/plain.py``): what is not plain data is refused
when written, naming where it sits; tagged records come back as the dataclasses they were. (Loading with
weights_only, a crafted file, the earlier format: tests/checkpoint/test_checkpoint.py.)"""

import numpy as np
import pytest

from pc_megatron.batch import Completion
from pc_megatron.checkpoint.plain import from_plain, to_plain
from pc_megatron.scheduler.types import Sample
from tests.checkpoint.test_checkpoint import _WritesAFile


def test_plain_data_round_trips_through_the_tagged_records():
    state = {"buf": [(1, [Sample(True, 1.0, 2, Completion(1, [3], [-0.5], "stop", 2, [(0, 2)]), 1)], 0, 0)],
             "rng": ("MT19937", np.arange(4, dtype=np.uint32), 1, 0, 0.0), "x": np.float64(0.5)}  # fmt: skip
    back = from_plain(to_plain(state))
    assert back["buf"] == state["buf"] and back["x"] == 0.5 and type(back["x"]) is float
    assert back["rng"][1].dtype == np.uint32 and back["rng"][1].tolist() == [0, 1, 2, 3]


def test_state_that_is_not_plain_data_is_refused_when_written_naming_where_it_sits(tmp_path):
    from pc_megatron.checkpoint.store import save_checkpoint

    with pytest.raises(TypeError, match=r"state\['scheduler'\]\['odd'\]: a .*_WritesAFile in the checkpoint state"):
        save_checkpoint(tmp_path, 1, {"scheduler": {"odd": _WritesAFile(tmp_path / "x")}}, keep_last=1)
