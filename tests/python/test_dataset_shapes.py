"""A graph with symbolic sizes reading a dataset directory on the workers (issue 26's Done-means:
"an epoch read by the workers from a dataset directory trains equal to the streamed one"): the
dataset's steps have different shapes (dynamic padding, a partial last batch); rank 0 reports each
index entry's shape (``fxdp.write_dataset`` writes it into the index; an index without it is read
from the shards' headers) and the server gives each step its shape's program. A real
``fxdp-server`` with 2 real ``fxdp-worker`` processes:

* the newcomer's tiny GPT-2 epoch (AdamW, clipping, a padding collator, ``drop_last=False``) read
  from a dataset directory equals the same epoch streamed, loss for loss and state;
* a symbolic MLP over 8, 5 and 3 rows from a dataset (with and without shapes in its index) equals
  ``run_local`` per step;
* an index whose shape of a step disagrees with its shard fails that step naming the step, the
  tensor and both shapes; one whose shape disagrees with its own rows fails at set-up.
"""

from __future__ import annotations

import json

import fxdp
import grpc
import pytest
import torch
from _tiny_gpt2 import gpt2_step, padded_epoch
from _util import ATOL, RTOL, ServerProcess
from fxdp.rpc_errors import ServerError
from test_shape_jobs import local, mlp_traced, rows

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("dataset_shapes")


@pytest.fixture(scope="module")
def client(data_dir):
    with (
        ServerProcess("--data-root", data_dir) as s,
        fxdp.Client(s.address, timeout=120) as c,
    ):
        yield c


def _drop_shapes(directory):
    """The index as an older ``write_dataset`` wrote it: no "shape" per entry."""
    index = json.loads((directory / "index.json").read_text())
    for s in index["steps"]:
        del s["shape"]
    (directory / "index.json").write_text(json.dumps(index))


def test_a_gpt2_epoch_of_mixed_lengths_from_a_dataset_equals_it_streamed(client, data_dir):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from _tiny_gpt2 import CONFIG

    loader = padded_epoch(5)
    batches = list(loader)
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    assert shapes[-1][0] == 3 and len(set(shapes)) == len(shapes), shapes  # 4 shapes
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**CONFIG, "n_positions": 64}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = fxdp.trace_step(gpt2_step, model, opt, batches[0], dynamic=True)
    assert fxdp.write_dataset(data_dir / "gpt2", loader) == 4

    streamed = client.train(step, 2, loader)
    seen = []
    ds = client.train(
        step,
        2,
        data_path=data_dir / "gpt2",
        steps=4,
        on_event=lambda e: e.step and e.shape and seen.append(e.shape),
    )

    assert ds.losses == pytest.approx(streamed.losses, rel=1e-5, abs=0), (ds.losses, streamed)
    for name, t in streamed.state.items():
        torch.testing.assert_close(ds.state[name], t, rtol=1e-5, atol=1e-6, msg=name)
    assert seen == [
        f"attention_mask={b}x{s} input_ids={b}x{s} labels={b}x{s}" for b, s in shapes
    ], seen
    info = client.job(ds.job_id)
    assert [c.steps for c in info.shapes] == [1, 1, 1, 1], info.shapes


@pytest.mark.parametrize("with_shapes", [True, False])
def test_a_symbolic_mlp_reads_a_dataset_of_three_shapes_like_one_device(
    client, data_dir, with_shapes
):
    step = mlp_traced()
    batches = [rows(b, seed) for seed, b in enumerate([8, 5, 3, 5], 1)]
    directory = data_dir / f"mlp-{with_shapes}"
    fxdp.write_dataset(directory, batches)
    if not with_shapes:
        _drop_shapes(directory)
    r = client.train(step, 2, data_path=directory, steps=6)  # entries 0-3, then 0-1 again
    want_state, want = local(step, batches + batches[:2])
    assert r.losses == pytest.approx(want, rel=RTOL, abs=ATOL)
    for name, t in want_state.items():
        torch.testing.assert_close(r.state[name], t, rtol=RTOL, atol=ATOL, msg=name)
    info = client.job(r.job_id)
    assert [(c.shape, c.steps) for c in info.shapes] == [
        ("x=8x6 y=8x3", 2),
        ("x=5x6 y=5x3", 3),
        ("x=3x6 y=3x3", 1),
    ]


def test_an_index_shape_that_is_not_the_shards_fails_naming_step_tensor_and_shapes(
    client, data_dir
):
    step = mlp_traced()
    directory = data_dir / "lying"
    wide = {"x": torch.randn(5, 7), "y": torch.randn(5, 3)}  # x has 7 columns, the graph's 6
    fxdp.write_dataset(directory, [rows(8, 1), wide])
    index = json.loads((directory / "index.json").read_text())
    index["steps"][1]["shape"]["x"] = [5, 6]  # what the graph takes, not what the shard holds
    (directory / "index.json").write_text(json.dumps(index))
    with pytest.raises(ServerError) as e:
        client.train(step, 2, data_path=directory, steps=2)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    msg = str(e.value)
    # The server takes the index's 5x6 and compiles it; the workers refuse the step.
    assert f"dataset '{directory}' step 2 (index entry 1" in msg, msg
    want = "tensor 'x': the index says the step's batch is [5, 6], its rows in the shard are [5, 7]"
    assert want in msg, msg


def test_an_index_shape_that_is_not_its_rows_fails_at_set_up(client, data_dir):
    step = mlp_traced()
    directory = data_dir / "rows"
    fxdp.write_dataset(directory, [rows(8, 1), rows(5, 2)])
    index = json.loads((directory / "index.json").read_text())
    index["steps"][1]["shape"]["x"] = [4, 6]
    (directory / "index.json").write_text(json.dumps(index))
    with pytest.raises(ServerError) as e:
        client.train(step, 2, data_path=directory, steps=2)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert "steps[1].shape['x'] has 4 rows; the entry's rows [8, 13] are 5" in str(e.value)
