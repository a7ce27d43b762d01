"""Soft CCA and the depth losses against values computed by hand."""

import math
import warnings

import pytest
import torch
from torch import nn

from docembed.losses.distill import DepthLoss
from docembed.losses.soft_cca import SoftCCALoss


def _identity_loss(k=2, eps=0.0, **kwargs):
    loss = SoftCCALoss(k, k, eps=eps, **kwargs)
    loss.student_projection = nn.Identity()  # hand-computable: both views are the raw inputs
    return loss


# Student view: features (1, 2, 3) and (1, 3, 2) -> after batch norm (biased variance 2/3):
# f1 = (-1, 0, 1) * sqrt(3/2), f2 = (-1, 1, 0) * sqrt(3/2).
S = torch.tensor([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]])
# Teacher view: (0, 0, 3) and (0, 3, 0) -> f1 = (-1, -1, 2)/sqrt(2), f2 = (-1, 2, -1)/sqrt(2).
T = torch.tensor([[0.0, 0.0], [0.0, 3.0], [3.0, 0.0]])


def test_soft_cca_first_step_by_hand():
    loss = _identity_loss(alpha=0.5, decorrelation_weight=2.0)
    loss.train()
    out = loss(S, T)
    r = math.sqrt(1.5)
    zs = [[-r, -r], [0, r], [r, 0]]
    q = 1 / math.sqrt(2)
    zt = [[-q, -q], [-q, 2 * q], [2 * q, -q]]
    l2 = sum((zs[i][j] - zt[i][j]) ** 2 for i in range(3) for j in range(2)) / 6
    # Batch covariances z^T z / 3; first step: Phi_1 = Sigma, c_1 = 1.
    cov_s = sum(zs[i][0] * zs[i][1] for i in range(3)) / 3  # 1.5 * 1 / 3 = 0.5
    cov_t = sum(zt[i][0] * zt[i][1] for i in range(3)) / 3  # (0.5 - 1 - 1) / 3 = -0.5
    assert cov_s == pytest.approx(0.5) and cov_t == pytest.approx(-0.5)
    decorrelation = abs(cov_s) + abs(cov_t)  # mean |off-diagonal| per view (both entries equal), summed
    assert float(out["l2"]) == pytest.approx(l2, rel=1e-5)
    assert float(out["decorrelation"]) == pytest.approx(decorrelation, rel=1e-5)
    assert float(out["loss"]) == pytest.approx(l2 + 2.0 * decorrelation, rel=1e-5)
    assert float(loss.count) == pytest.approx(1.0)
    assert float(loss.phi_student[0, 1]) == pytest.approx(0.5, rel=1e-5)


def test_soft_cca_running_covariance_across_steps():
    loss = _identity_loss(alpha=0.5)
    loss.train()
    loss(S, T)  # Phi_1 = [[1, .5], [.5, 1]] (student), c_1 = 1
    # Second batch: student features (1, 2, 3) and (3, 2, 1): perfectly anti-correlated, covariance -1.
    s2 = torch.tensor([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    out = loss(s2, T)
    # Phi_2 = 0.5 * Phi_1 + Sigma_2 -> off-diagonal 0.25 - 1 = -0.75; c_2 = 0.5 * 1 + 1 = 1.5.
    student_term = 0.75 / 1.5
    # Teacher: the same batch twice: Phi_2 off-diagonal = 0.5 * -0.5 - 0.5 = -0.75, / 1.5.
    teacher_term = 0.75 / 1.5
    assert float(out["decorrelation"]) == pytest.approx(student_term + teacher_term, rel=1e-5)
    assert float(loss.count) == pytest.approx(1.5)
    assert float(loss.phi_student[0, 1]) == pytest.approx(-0.75, rel=1e-5)
    # The history is detached: the gradient flows only through this batch's covariance.
    s3 = s2.clone().requires_grad_(True)
    loss(s3, T)["loss"].backward()
    assert s3.grad is not None and torch.isfinite(s3.grad).all()


def test_soft_cca_eval_mode_leaves_buffers_alone():
    loss = _identity_loss(alpha=0.5)
    loss.train()
    loss(S, T)
    phi, count = loss.phi_student.clone(), loss.count.clone()
    loss.eval()
    loss(S.flip(0), T)
    assert torch.equal(loss.phi_student, phi) and torch.equal(loss.count, count)


def test_soft_cca_buffers_are_in_state_dict():
    keys = set(SoftCCALoss(4, 3).state_dict())
    assert {"phi_student", "phi_teacher", "count"} <= keys


def test_soft_cca_batch_of_one_is_zero_with_warning():
    loss = SoftCCALoss(4, 3)
    loss.train()
    s = torch.randn(1, 4, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = loss(s, torch.randn(1, 3))
    assert float(out["loss"].detach()) == 0.0
    assert any("batch of at least 2" in str(w.message) for w in caught)
    out["loss"].backward()  # still part of the graph
    assert float(loss.count) == 0.0 and float(loss.phi_student.abs().sum()) == 0.0


def test_soft_cca_batch_of_two_by_hand():
    # Two rows: batch norm maps each feature to -1/+1 (or 0 when both values are equal).
    loss = _identity_loss(alpha=0.95, eps=1e-12)  # a constant feature normalises to 0, not 0/0
    loss.train()
    s = torch.tensor([[0.0, 5.0], [2.0, 1.0]])  # features -> (-1, 1) and (1, -1)
    t = torch.tensor([[1.0, 1.0], [3.0, 1.0]])  # features -> (-1, 1) and (0, 0)
    out = loss(s, t)
    l2 = ((0**2 + 0**2) + (-1 - 0) ** 2 + (1 - 0) ** 2) / 4  # (z_s - z_t)^2 averaged over 2 x 2 entries
    cov_s = ((-1) * 1 + 1 * (-1)) / 2  # -1
    cov_t = 0.0
    assert float(out["l2"]) == pytest.approx(l2)
    assert float(out["decorrelation"]) == pytest.approx(abs(cov_s) + abs(cov_t))


def test_soft_cca_projections_cannot_collapse():
    # Tiny inputs still come out of the projection with unit variance per feature.
    loss = SoftCCALoss(3, 3, teacher_projection="linear")
    with torch.no_grad():
        for p in loss.parameters():
            p.mul_(0.2)
    raw = loss.student_projection(torch.randn(64, 3)).detach()
    assert float(raw.std(0).max()) < 0.05
    z = loss._normalise(raw)
    assert torch.allclose(z.var(0, unbiased=False), torch.ones(3), atol=1e-2)


def test_ablation_objectives():
    torch.manual_seed(0)
    mse = SoftCCALoss(2, 2, objective="mse")
    mse.student_projection = nn.Identity()
    out = mse(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]]))
    assert float(out["loss"]) == pytest.approx(2.5)  # MSE works with a batch of one
    with pytest.raises(ValueError):
        SoftCCALoss(2, 2, objective="mse", teacher_projection="linear")
    cca = SoftCCALoss(1, 1, objective="cca", ridge=0.0)
    cca.student_projection = nn.Identity()
    x = torch.tensor([[1.0], [2.0], [4.0]])
    y = torch.tensor([[2.0], [1.0], [5.0]])
    corr = torch.corrcoef(torch.cat([x, y], 1).T)[0, 1]
    assert float(cca(x, y)["loss"]) == pytest.approx(-abs(float(corr)), rel=1e-4)


# --- depth losses ---------------------------------------------------------------------------------------
def test_depth_cosine_and_mse_by_hand():
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    t = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    cos0 = 1 / math.sqrt(2)
    assert float(DepthLoss("cosine")(s, t)) == pytest.approx(((1 - cos0) + 0.0) / 2, rel=1e-6)
    mse = ((0 + 1) / 2 + (0 + 1) / 2) / 2
    assert float(DepthLoss("mse")(s, t)) == pytest.approx(mse)


def test_depth_weights_apply_per_input():
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    t = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # both cosine distances are 1
    assert float(DepthLoss("cosine")(s, t, torch.tensor([1.0, 0.0]))) == pytest.approx(0.5)
    assert float(DepthLoss("cosine")(s, t, torch.tensor([2.0, 1.0]))) == pytest.approx(1.5)
    assert float(DepthLoss("cosine")(s, t, torch.tensor([0.0, 0.0]))) == 0.0


def test_depth_margin_is_bounded_hinge():
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    m = 0.5
    r = 1 / math.sqrt(2)
    # sims[i][j] = cos(s_i, t_j)
    sims = [[1, 0, -1], [0, 1, 0], [r, r, -r]]
    expected = []
    for i in range(3):
        terms = [max(0.0, m - sims[i][i] + sims[i][j]) for j in range(3) if j != i]
        expected.append(sum(terms) / 2)
    got = DepthLoss("margin", margin=m)(s, t)
    assert float(got) == pytest.approx(sum(expected) / 3, rel=1e-5)
    # Perfectly separated inputs give exactly 0, never below.
    e = torch.eye(3)
    assert float(DepthLoss("margin", margin=0.5)(e, e)) == 0.0
    assert float(DepthLoss("margin")(s[:1], t[:1])) == 0.0  # no negatives in a batch of one


def test_running_covariance_under_ddp_is_the_mean_of_the_ranks_batches(tmp_path):
    """Two gloo ranks, each with its own batch: Phi_1 is the mean of the two batch covariances on both
    ranks; at step 2 rank 1 has a batch of one (no statistics), so Phi_2 = alpha Phi_1 + rank 0's alone."""
    from pathlib import Path

    from cli_helpers import torchrun

    proc = torchrun(tmp_path, script=Path(__file__).with_name("soft_cca_ranks.py"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for view in "st":
        phi1 = (r0[f"cov_{view}0"] + r1[f"cov_{view}0"]) / 2
        assert torch.allclose(r0[f"phi_{view}0"], phi1, atol=1e-6)
        assert torch.allclose(r1[f"phi_{view}0"], phi1, atol=1e-6)
        phi2 = 0.5 * phi1 + r0[f"cov_{view}1"]
        assert torch.allclose(r0[f"phi_{view}1"], phi2, atol=1e-6)
        assert torch.allclose(r1[f"phi_{view}1"], phi2, atol=1e-6)
    assert r0["count1"].item() == r1["count1"].item() == pytest.approx(1.5)
