"""The worked controller of ``examples/curriculum`` (bounded): per-domain loss from
``dataset_ids``, exponentiated-gradient decisions, checkpoint at dp 2, resume at dp 1 and 4."""

from __future__ import annotations

from pathlib import Path

from examples.curriculum.controller import DOMAINS, ExpGradController, plot, run


def test_controller_resumes_at_other_dp(tmp_path: Path) -> None:
    summary = run(tmp_path, steps=16, every=4, save_at=8)
    log = summary["log"]
    assert [s for s, _ in log] == [4, 8, 12, 16]
    assert all(abs(sum(w.values()) - 1) < 1e-12 for _, w in log)
    assert len({tuple(w.values()) for _, w in log}) == 4  # every decision moved the weights
    for dp in ("dp1", "dp4"):
        assert summary[dp]["same_batches"], dp
        assert summary[dp]["same_log"], dp
        assert summary[dp]["max_loss_diff"] < 1e-5, dp
    result = summary["result"]
    # Per-domain losses come from dataset_ids: every domain is measured (0 = no token).
    for k in range(len(DOMAINS)):
        assert sum(result["domain_loss"][s][k] > 0 for s in result["domain_loss"]) >= 8, k
    plot(result, DOMAINS, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exponentiated_gradient_rule() -> None:
    c = ExpGradController(["a", "b"], eta=1.0, smoothing=0.0)
    w = c.update([2.0, 1.0])  # a's loss is 0.5 above the mean, b's 0.5 below
    ratio = w["a"] / w["b"]
    assert abs(ratio - 2.718281828459045) < 1e-9
    c = ExpGradController(["a", "b"], eta=1.0, smoothing=0.5)
    w = c.update([1.0, 1.0])
    assert w == {"a": 0.5, "b": 0.5}
