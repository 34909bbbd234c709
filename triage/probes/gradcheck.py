"""gradcheck: torch.autograd.gradcheck in float64 on every custom autograd.Function the run's graphs used.

The training-health monitor (triage/health.py) records each Function class it
meets in a backward graph and how many tensor inputs it takes. The probe calls
each on fresh random float64 inputs (never the user's tensors), so it changes
nothing; a Function whose forward will not take such inputs is reported as not
checked rather than guessed at.
"""

from __future__ import annotations

from ..diagnosis import ProbeResult
from .context import ProbeContext

INPUT_SHAPE = (3, 4)


def gradcheck(ctx: ProbeContext) -> ProbeResult:
    import torch

    from .. import health

    monitor = health.MONITOR
    functions = dict(monitor.custom_functions) if monitor is not None else {}
    if not functions:
        return ProbeResult("gradcheck", "skipped", "no custom autograd.Function was seen in this run's backward graphs")
    failed, passed, unchecked = [], [], []
    generator = torch.Generator().manual_seed(0)
    for name, cls in sorted(functions.items()):
        inputs = tuple(torch.randn(INPUT_SHAPE, dtype=torch.float64, generator=generator, requires_grad=True)
                       for _ in range(max(1, monitor.function_inputs.get(name, 1))))
        try:
            ok = torch.autograd.gradcheck(cls.apply, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=False)
        except Exception as exc:  # the forward does not take float64 tensors of this shape
            unchecked.append(f"{name} ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})")
            continue
        (passed if ok else failed).append(name)
        if not ok:
            mismatch = health.backward_mismatch(cls, len(inputs))
            if mismatch:
                failed[-1] = f"{name} ({mismatch})"
    facts = {"failed": failed, "passed": passed, "unchecked": unchecked}
    shape = "x".join(map(str, INPUT_SHAPE))
    if failed:
        return ProbeResult("gradcheck", "confirmed",
                           f"gradcheck in float64 on random {shape} inputs fails for {', '.join(failed)}: the analytical "
                           f"Jacobian of backward differs from the numerical one" +
                           (f"; passes for {', '.join(passed)}" if passed else ""), facts=facts)
    if passed:
        return ProbeResult("gradcheck", "refuted",
                           f"gradcheck in float64 on random {shape} inputs passes for {', '.join(passed)}", facts=facts)
    return ProbeResult("gradcheck", "inconclusive", f"could not call {', '.join(unchecked)} on float64 inputs", facts=facts)
