"""MemoryMeter on CPU: exact live-tensor bytes, checked against hand-computed oracles and MemTracker."""

import gc

import pytest

torch = pytest.importorskip("torch")

from zerokit.measure.meter import MemoryMeter, measure_overhead


@pytest.fixture
def meter():
    m = MemoryMeter("cpu").start()
    yield m
    m.close()


def test_empty_view_del(meter):
    base = meter.current_bytes()
    a = torch.empty(1000, dtype=torch.float32)
    assert meter.current_bytes() - base == 4000
    v = a[10:500].view(-1, 10)  # views share the storage: +0
    assert meter.current_bytes() - base == 4000
    a.add_(1.0)  # in-place: same storage, +0
    assert meter.current_bytes() - base == 4000
    del a
    assert meter.current_bytes() - base == 4000  # the view keeps the storage alive
    del v
    assert meter.current_bytes() - base == 0
    assert meter.peak_bytes() - base >= 4000


def test_dtypes_and_factories(meter):
    base = meter.current_bytes()
    ts = [torch.zeros(10, 10, dtype=torch.bfloat16), torch.ones(7, dtype=torch.int64), torch.tensor([1.0, 2.0])]
    assert meter.current_bytes() - base == 200 + 56 + 8
    ts.append(torch.cat([ts[0], ts[0]]))
    assert meter.current_bytes() - base == 200 + 56 + 8 + 400
    del ts
    assert meter.current_bytes() == base


def test_resize_followed(meter):
    base = meter.current_bytes()
    t = torch.empty(10)
    t.resize_(100)
    assert meter.current_bytes() - base == 400
    t.untyped_storage().resize_(0)  # ZeRO-3 frees partitions this way
    assert meter.current_bytes() - base == 0
    assert meter.peak_bytes() - base == 400


def test_existing_tensors_registered():
    pre = torch.empty(250)  # created before start: not counted unless registered
    m = MemoryMeter("cpu").start()
    try:
        assert m.current_bytes() == 0
        m.register_existing([pre, pre[3:]], category="states")
        assert m.current_bytes() == 1000
        assert m.summary()["categories"] == {"states": 1000}
        del pre
        gc.collect()
        assert m.current_bytes() == 0
    finally:
        m.close()


def test_linear_forward_backward_oracle(meter):
    """Linear(100 -> 50), batch 20, fp32, input without grad. By hand:
    params 50*100*4 + 50*4 = 20200; x 20*100*4 = 8000; y 20*50*4 = 4000; loss 4 bytes;
    backward: the scalar grad seed (4 bytes, expanded as a view) then grad_W 20000 and grad_b 200."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(100, 50)
    x = torch.randn(20, 100)
    assert meter.current_bytes() == 20200 + 8000
    meter.register_module(lin)
    with meter.phase("forward"):
        y = lin(x)
        loss = y.sum()
    with meter.phase("backward"):
        loss.backward()
    s = meter.summary()
    fw, bw = s["phases"]["forward"], s["phases"]["backward"]
    assert fw == {"start_bytes": 28200, "end_bytes": 28200 + 4000 + 4, "peak_bytes": 28200 + 4004}
    # after backward the seed is gone and both gradients are held
    assert bw["end_bytes"] == 32204 + 20200
    # at the peak the seed (4 bytes) is still alive while the gradients are produced
    assert bw["peak_bytes"] == 32204 + 20200 + 4
    assert s["peak_bytes"] == 32204 + 20200 + 4
    assert s["categories"]["parameters"] == 20200
    assert s["categories"]["gradients"] == 20200
    del y, loss
    lin.zero_grad(set_to_none=True)
    assert meter.current_bytes() == 28200


def test_nested_phases_and_repeats(meter):
    with meter.phase("step"):
        with meter.phase("inner"):
            t = torch.empty(100)  # 400
            del t
        u = torch.empty(10)  # 40
    with meter.phase("step"):
        pass
    s = meter.summary()["phases"]
    assert s["inner"]["peak_bytes"] - s["inner"]["start_bytes"] == 400
    assert s["step"]["peak_bytes"] - s["inner"]["start_bytes"] == 400  # the inner peak counts for the outer
    assert s["step"]["count"] == 2
    del u


def _mlp_step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_agrees_with_memtracker():
    """Same step under both trackers (nested modes both see every op). MemTracker counts the same unique
    storages on CPU (it rounds only CUDA sizes to 512 B), so the peaks agree exactly; MemTracker misses
    tensors created outside its context unless passed to track_external, as does the meter."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    meter = MemoryMeter("cpu").start()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(16, 64)
        meter.reset_peak()
        mt = MemTracker()
        mt.track_external(model, opt, x)
        with mt:
            for _ in range(2):  # the second step has optimizer states alive
                _mlp_step(model, opt, x)
                mt.reset_mod_stats()
        ours = meter.peak_bytes()
    finally:
        meter.close()
    theirs = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)


def test_summary_shape(meter):
    with meter.phase("forward"):
        t = torch.empty(3)
    s = meter.summary()
    assert s["method"] == "live_tensor_bytes"
    assert set(s["phases"]["forward"]) >= {"peak_bytes", "start_bytes", "end_bytes"}
    assert isinstance(s["peak_bytes"], int)
    del t


def test_stop_restores_resize():
    orig = torch.UntypedStorage.resize_
    m = MemoryMeter("cpu").start()
    assert torch.UntypedStorage.resize_ is not orig
    m.close()
    assert torch.UntypedStorage.resize_ is orig
    t = torch.empty(5)
    assert m.current_bytes() == 0  # stopped: no longer tracking
    del t


def test_overhead_runs():
    r = measure_overhead(steps=2, hidden=32, layers=2, batch=4)
    assert r["ratio"] > 0 and r["peak_bytes"] > 0


def _make_big():
    return torch.ones(100_000).to(torch.float64)  # a float32 input, then its 800 kB float64 copy


def test_explain_names_the_op_and_the_call_site_of_what_was_live_at_the_peak(monkeypatch):
    """ZEROKIT_METER_EXPLAIN=1 (or explain=True): each storage keeps the op and the Python frames that made it, and
    the live set at the peak is summed by category and origin. The peak here is the float64 copy beside its input,
    not the small tensor made after both are gone."""
    monkeypatch.setenv("ZEROKIT_METER_EXPLAIN", "1")
    m = MemoryMeter("cpu").start()
    try:
        keep = torch.zeros(1000)
        big = _make_big()
        del big
        small = torch.ones(10)
    finally:
        m.stop()
    rows = m.peak_tensors()
    assert sum(r["bytes"] for r in rows) == m.peak_bytes() == 4000 + 400_000 + 800_000
    assert rows[0]["bytes"] == 800_000 and rows[0]["origin"].startswith("aten._to_copy")
    assert "test_measure.py" in rows[0]["origin"] and "_make_big" in rows[0]["origin"]
    assert rows[1]["origin"].startswith("aten.ones") and rows[2]["origin"].startswith("aten.zeros")
    assert keep.numel() and small.numel()
    monkeypatch.delenv("ZEROKIT_METER_EXPLAIN")
    plain = MemoryMeter("cpu").start()
    torch.ones(10)
    plain.stop()
    assert plain.peak_tensors() == []  # off by default: no stack walk, no copy of the live set
