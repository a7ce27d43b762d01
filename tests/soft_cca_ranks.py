"""Run by tests/test_soft_cca.py under torchrun (2 gloo ranks): two Soft CCA training steps per rank, each
on the rank's own batch (rank 1's second batch has one row). Writes, per rank, the running covariances
after each step and the batch covariances the rank computed itself."""

import sys

import torch
import torch.distributed as dist

from docembed.losses.soft_cca import SoftCCALoss


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same projections on every rank
    loss = SoftCCALoss(student_dim=6, teacher_dim=4, alpha=0.5).train()
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    record = {}
    for step, size in enumerate([5, 1 if rank == 1 else 3]):
        student = torch.randn(size, 6, generator=generator)
        teacher = torch.randn(size, 4, generator=generator)
        with torch.no_grad():
            zs = loss._normalise(loss.student_projection(student))
            zt = loss._normalise(loss.teacher_projection(teacher))
        loss(student, teacher)["loss"].backward()
        record[f"cov_s{step}"], record[f"cov_t{step}"] = zs.T @ zs / size, zt.T @ zt / size
        record[f"phi_s{step}"] = loss.phi_student.clone()
        record[f"phi_t{step}"] = loss.phi_teacher.clone()
        record[f"count{step}"] = loss.count.clone()
    torch.save(record, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
