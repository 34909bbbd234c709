"""Knowledge distillation with a hand-written KL term and a NaN guard in the training loop.

The bug: the teacher's logits are sharpened with temperature 0.01, so softmax underflows
to exact zeros; p * log(p) is then 0 * -inf = nan, and the loop's own guard raises
FloatingPointError on the first step. Use F.kl_div(student_log_probs, teacher_log_probs,
log_target=True) or torch.xlogy(p, p), which define 0 * log 0 = 0.
"""

import torch
import torch.nn as nn


def distill_loss(student_logits, teacher_logits, temperature):
    p = torch.softmax(teacher_logits / temperature, dim=-1)
    log_q = torch.log_softmax(student_logits, dim=-1)
    return (p * (torch.log(p) - log_q)).sum(dim=-1).mean()


def main():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    student = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 10))
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    for step in range(100):
        x = torch.randn(32, 20)
        with torch.no_grad():
            teacher_logits = teacher(x)
        loss = distill_loss(student(x), teacher_logits, temperature=0.01)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
