"""Soft CCA (Chang, Xiang & Hospedales 2018, "Scalable and Effective Deep CCA via Soft Decorrelation"),
the breadth loss that ties the student to the Paragraph Vector teacher.

The derivation, the choices made and their reasons are in docs/soft-cca.md.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

OBJECTIVES = ("soft-cca", "mse", "cca")


class SoftCCALoss(nn.Module):
    def __init__(
        self,
        student_dim: int,
        teacher_dim: int,
        dim: int | None = None,
        hidden: int | None = None,
        teacher_projection: str = "identity",
        objective: str = "soft-cca",
        alpha: float = 0.95,
        decorrelation_weight: float = 1.0,
        eps: float = 1e-8,
        ridge: float = 1e-3,
    ):
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"breadth objective must be one of {OBJECTIVES}, got {objective!r}")
        if teacher_projection not in ("identity", "linear"):
            raise ValueError(f"teacher projection must be 'identity' or 'linear', got {teacher_projection!r}")
        if objective == "mse" and teacher_projection != "identity":
            # Two free projections regressed onto each other collapse to a constant.
            raise ValueError("the mse objective needs the identity teacher projection")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        k = teacher_dim if teacher_projection == "identity" else (dim or teacher_dim)
        hidden = hidden or max(k, student_dim)
        self.student_projection = nn.Sequential(
            nn.Linear(student_dim, hidden), nn.GELU(), nn.Linear(hidden, k)
        )
        self.teacher_projection = (
            nn.Identity() if teacher_projection == "identity" else nn.Linear(teacher_dim, k)
        )
        self.objective = objective
        self.alpha = alpha
        self.decorrelation_weight = decorrelation_weight
        self.eps = eps
        self.ridge = ridge
        self.register_buffer("phi_student", torch.zeros(k, k))
        self.register_buffer("phi_teacher", torch.zeros(k, k))
        self.register_buffer("count", torch.zeros(()))
        self._warned = False

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"loss", "l2", "decorrelation"} for a batch of student and teacher vectors (B, d_s), (B, d_t)."""
        with torch.autocast(student.device.type, enabled=False):
            zs = self.student_projection(student.float())
            zt = self.teacher_projection(teacher.float())
            if self.objective == "mse":
                loss = ((zs - zt) ** 2).mean()
                return {"loss": loss, "l2": loss.detach(), "decorrelation": torch.zeros_like(loss).detach()}
            if len(zs) < 2:
                if self.training and self.objective == "soft-cca":
                    self._update_history(None, None)  # under DDP the other ranks wait for this one
                if not self._warned:
                    warnings.warn(
                        "Soft CCA needs a batch of at least 2; a batch of 1 adds no breadth loss",
                        stacklevel=2,
                    )
                    self._warned = True
                zero = zs.sum() * 0.0
                return {"loss": zero, "l2": zero.detach(), "decorrelation": zero.detach()}
            if self.objective == "cca":
                return self._batch_cca(zs, zt)
            zs, zt = self._normalise(zs), self._normalise(zt)
            l2 = ((zs - zt) ** 2).mean()
            cov_s, cov_t = zs.T @ zs / len(zs), zt.T @ zt / len(zt)
            decorrelation = self._decorrelation(cov_s, self.phi_student)
            decorrelation = decorrelation + self._decorrelation(cov_t, self.phi_teacher)
            if self.training:
                self._update_history(cov_s.detach(), cov_t.detach())
            return {
                "loss": l2 + self.decorrelation_weight * decorrelation,
                "l2": l2.detach(),
                "decorrelation": decorrelation.detach(),
            }

    def _normalise(self, z: torch.Tensor) -> torch.Tensor:
        # Batch norm without learnable scale or shift: per feature, zero mean and unit (biased) variance.
        mean = z.mean(0, keepdim=True)
        var = z.var(0, unbiased=False, keepdim=True)
        return (z - mean) / torch.sqrt(var + self.eps)

    def _decorrelation(self, batch_cov: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        """Mean |off-diagonal| of the running covariance (alpha * Phi_{t-1} + Sigma_batch) / c_t."""
        running = self.alpha * phi.detach() + batch_cov
        normalised = running / (self.alpha * self.count + 1.0)
        k = len(normalised)
        off_diagonal = normalised - torch.diag(torch.diagonal(normalised))
        return off_diagonal.abs().sum() / max(k * (k - 1), 1)

    @torch.no_grad()
    def _update_history(self, cov_s: torch.Tensor | None, cov_t: torch.Tensor | None) -> None:
        """Phi_t = alpha * Phi_{t-1} + Sigma_batch and c_t = alpha * c_{t-1} + 1. Under DDP, Sigma_batch is
        the mean of the ranks' batch covariances (ranks with a batch of one contribute nothing), so the
        history is the same on every rank and covers all the data of the step."""
        import torch.distributed as dist

        k = len(self.phi_student)
        contributed = self.count.new_tensor(0.0 if cov_s is None else 1.0)
        if cov_s is None:
            cov_s, cov_t = self.phi_student.new_zeros(k, k), self.phi_teacher.new_zeros(k, k)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            packed = torch.cat([cov_s.flatten(), cov_t.flatten(), contributed.view(1)])
            dist.all_reduce(packed)
            contributed = packed[-1]
            cov_s, cov_t = packed[: k * k].view(k, k), packed[k * k : 2 * k * k].view(k, k)
            if contributed > 0:
                cov_s, cov_t = cov_s / contributed, cov_t / contributed
        if contributed > 0:
            self.phi_student.mul_(self.alpha).add_(cov_s)
            self.phi_teacher.mul_(self.alpha).add_(cov_t)
            self.count.mul_(self.alpha).add_(1.0)

    def _batch_cca(self, zs: torch.Tensor, zt: torch.Tensor) -> dict[str, torch.Tensor]:
        """Minus the mean canonical correlation of the batch: the singular values of
        S_ss^{-1/2} S_st S_tt^{-1/2}, each covariance with a ridge so small batches stay invertible."""
        zs = zs - zs.mean(0, keepdim=True)
        zt = zt - zt.mean(0, keepdim=True)
        n = len(zs) - 1
        eye = torch.eye(zs.shape[1], device=zs.device)
        s_ss = zs.T @ zs / n + self.ridge * eye
        s_tt = zt.T @ zt / n + self.ridge * eye
        s_st = zs.T @ zt / n
        t = _inverse_sqrt(s_ss) @ s_st @ _inverse_sqrt(s_tt)
        correlation = torch.linalg.svdvals(t).mean()
        return {
            "loss": -correlation,
            "l2": torch.zeros_like(correlation),
            "decorrelation": -correlation.detach(),
        }


def _inverse_sqrt(matrix: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(matrix)
    return vectors @ torch.diag(values.clamp(min=1e-12).rsqrt()) @ vectors.T
