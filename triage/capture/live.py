"""Turn a live exception, its frames still alive, into an Incident; and find the live objects probes need.

The Incident gets the exception chain as Python prints it (runpy and triage
frames hidden), a DataLoader worker's own traceback unwrapped from the message,
bounded summaries of user-frame locals, and facts about the model, the
failing module, the loader, the optimizer and the last batch. The live
references (module and its call arguments, model, batch) go beside it in a
ProbeContext, never into the Incident.
"""

from __future__ import annotations

import inspect
import linecache
import re
import sys
import types
from typing import Any

from ..incident import ExceptionInfo, Frame, Incident, is_user_path
from ..context import ProbeContext
from .environment import environment, launcher_rank
from .frames import is_hidden_file, user_traceback
from .secrets import SCRUBBED, is_secret_name, scrub_text
from .summarize import summarize, summarize_loader, summarize_module, summarize_optimizer

MAX_CHAIN = 16
MAX_FRAMES = 200
MAX_FRAMES_WITH_LOCALS = 6
MAX_LOCALS = 24
MAX_MESSAGE_CHARS = 64 * 1024
MAX_MODULES_SEARCHED = 50_000

_MODULE_CALL_FUNCTIONS = {"_call_impl", "_wrapped_call_impl", "__call__"}
_FORWARD_CALLERS = {"_call_impl", "inner", "_slow_forward"}
_WORKER = re.compile(r"in DataLoader worker process (?P<worker>\d+)")
_SPAWNED = re.compile(r"-- Process (?P<rank>\d+) terminated with the following error")
_WRAPPER_TYPES = {"ChildFailedError", "ProcessRaisedException", "ProcessExitedException", "Empty"}
# After one of these, every CUDA call may raise or hang: read metadata only.
CUDA_POISON = re.compile(
    r"CUDA error|CUDA kernel errors|device-side assert|illegal memory access|CUBLAS_STATUS|CUDNN_STATUS|cuDNN error"
    r"|unspecified launch failure|misaligned address|ECC error|HIP error|hipError|AcceleratorError|NCCL error"
)
_LOCAL_PRIORITY = ("Tensor", "Parameter", "module", "optimizer", "dataloader", "ndarray")


def cuda_poisoned(messages: list[str]) -> bool:
    return any(CUDA_POISON.search(message or "") for message in messages)


def capture_exception(
    exc: BaseException,
    tb: types.TracebackType | None = None,
    *,
    tracker: Any = None,
    thread_name: str | None = None,
    exit_code: int | None = 1,
    log_lines: list[str] | None = None,
) -> ProbeContext:
    """Everything worth keeping about a live exception. `tb` is the traceback to show (default: trimmed)."""
    chain = exception_chain(exc)
    traceback_of = {id(e): (tb if e is exc and tb is not None else user_traceback(e.__traceback__)) for e, _ in chain}
    pairs: list[tuple[BaseException, ExceptionInfo]] = []
    infos: list[ExceptionInfo] = []
    for member, link in chain:
        info = ExceptionInfo(
            type=_type_name(type(member)),
            message=_message(member),
            frames=_frames(traceback_of[id(member)]) + _syntax_error_frame(member),
            link=link,
        )
        _attach_user_code(info)
        pairs.append((member, info))
        infos.append(info)
        infos.extend(_unwrap_worker(info))
    _attach_forward_trace(infos, log_lines or [])
    poisoned = cuda_poisoned([info.message for info in infos])
    candidates = [e for e in infos if not e.wrapper and e.type and e.short_type not in _WRAPPER_TYPES]
    root = candidates[0] if candidates else infos[-1]

    incident = Incident(kind="exception", source="run", exception=root, exceptions=infos, exit_code=exit_code)
    incident.rank, incident.worker = (root.rank if root.rank is not None else launcher_rank()), root.worker
    incident.log_lines = [scrub_text(line) for line in (log_lines or [])]
    incident.environment = environment(cuda_usable=not poisoned)
    incident.facts["cuda_poisoned"] = poisoned
    if thread_name:
        incident.facts["thread"] = thread_name
        incident.notes.append(f"raised in thread {thread_name!r}; the main thread carried on")

    live = ProbeContext(incident=incident, exception=exc)
    # Innermost-last live frames: the root cause's (when it has live frames), then the raised exception's.
    frames = [entry.tb_frame for entry in _entries(traceback_of[id(exc)])]
    root_member = next((member for member, info in pairs if info is root), None)
    if root_member is not None and root_member is not exc:
        frames = [entry.tb_frame for entry in _entries(traceback_of[id(root_member)])] + frames
    _attach_locals(pairs, traceback_of, cuda_usable=not poisoned)
    outermost = _find_live_objects(live, frames, tracker)
    _add_facts(live, tracker, outermost)
    return live


def exception_chain(exc: BaseException) -> list[tuple[BaseException, str | None]]:
    """The exceptions in the order Python prints them, each with how it links to the one before."""
    out: list[tuple[BaseException, str | None]] = []
    seen: set[int] = set()

    def walk(current: BaseException, link: str | None) -> None:
        if id(current) in seen or len(out) >= MAX_CHAIN:
            return
        seen.add(id(current))
        if current.__cause__ is not None:
            walk(current.__cause__, None)
            out.append((current, "cause"))
        elif current.__context__ is not None and not current.__suppress_context__:
            walk(current.__context__, None)
            out.append((current, "context"))
        else:
            out.append((current, link))

    walk(exc, None)
    return out


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in (None, "__main__", "builtins") else f"{module}.{name}"


def _message(exc: BaseException) -> str:
    try:
        text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    except Exception:
        text = "<exception str() failed>"
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, (list, tuple)):
        text = "\n".join([text, *(str(note) for note in notes[:20])])
    return scrub_text(text[:MAX_MESSAGE_CHARS])


def _entries(tb: types.TracebackType | None):
    entries = []
    while tb is not None and len(entries) < MAX_FRAMES:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _frames(tb: types.TracebackType | None) -> list[Frame]:
    frames = []
    for entry in _entries(tb):
        code = entry.tb_frame.f_code
        filename = code.co_filename
        line = linecache.getline(filename, entry.tb_lineno, entry.tb_frame.f_globals).strip() or None
        frames.append(
            Frame(file=filename, line=entry.tb_lineno, function=code.co_name,
                  code=scrub_text(line) if line else None, user=is_user_path(filename))
        )  # fmt: skip
    return frames


def _syntax_error_frame(exc: BaseException) -> list[Frame]:
    """A SyntaxError's location is the line that did not compile, which no traceback frame shows."""
    if not isinstance(exc, SyntaxError) or not exc.filename or not exc.lineno:
        return []
    code = (exc.text or "").strip() or None
    return [Frame(file=exc.filename, line=exc.lineno, function="<module>", code=code, user=is_user_path(exc.filename))]


def _attach_user_code(info: ExceptionInfo) -> None:
    """Dynamo ends the message of an error raised while tracing with the user's code ("from user code:")."""
    if "from user code:" in info.message:
        from ..logparse import side_stack_in_text

        info.side_label, info.side_frames = side_stack_in_text(info.message)


def _attach_forward_trace(infos: list[ExceptionInfo], warnings: list[str]) -> None:
    """Anomaly mode warns with the forward call's stack just before backward raises: give it to that error."""
    trace = next((line for line in reversed(warnings) if "Traceback of forward call that caused the error" in line), None)
    if trace is None:
        return
    from ..logparse import FORWARD_CALL, side_stack_in_text

    label, frames = side_stack_in_text(trace)
    frames = [frame for frame in frames if not is_hidden_file(frame.file)]  # the runner's and runpy's
    if label != FORWARD_CALL or not frames:
        return
    for info in infos:
        # The error anomaly mode reported is raised by the autograd engine, under backward() or grad().
        if not info.side_frames and any(_is_autograd_frame(frame) for frame in info.frames):
            info.side_label, info.side_frames = label, frames
            return


def _is_autograd_frame(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return "/torch/autograd/" in path or (path.endswith("/torch/_tensor.py") and frame.function == "backward")


def _unwrap_worker(outer: ExceptionInfo) -> list[ExceptionInfo]:
    """A DataLoader worker's (or mp.spawn child's) traceback inside the message is the real failure."""
    if "Traceback (most recent call last)" not in outer.message:
        return []
    from ..logparse import parse_text

    nested = parse_text(outer.message)
    if not nested.exceptions:
        return []
    worker = _WORKER.search(outer.message)
    spawned = _SPAWNED.search(outer.message)
    for inner in nested.exceptions:
        inner.line_no = None
        inner.worker = int(worker.group("worker")) if worker else inner.worker
        inner.rank = int(spawned.group("rank")) if spawned else inner.rank
    outer.wrapper = True
    return nested.exceptions


def _attach_locals(pairs, traceback_of, cuda_usable: bool) -> None:
    """Summaries of user-frame locals, innermost frames first, each live frame summarised once."""
    done: dict[int, dict[str, Any]] = {}
    budget = MAX_FRAMES_WITH_LOCALS
    for member, info in reversed(pairs):
        entries = _entries(traceback_of[id(member)])
        for frame_info, entry in reversed(list(zip(info.frames, entries))):
            if not frame_info.user:
                continue
            key = id(entry.tb_frame)
            if key not in done:
                if budget <= 0:
                    continue
                budget -= 1
                done[key] = summarize_locals(entry.tb_frame, cuda_usable=cuda_usable)
            frame_info.locals = done[key]


def summarize_locals(frame: types.FrameType, *, cuda_usable: bool = True) -> dict[str, Any]:
    """Bounded summaries of a frame's locals; modules, functions, classes and dunder names skipped."""
    try:
        names = list(frame.f_locals.items())
    except Exception:
        return {}
    chosen = []
    for name, value in names:
        if not isinstance(name, str) or name.startswith("__") or _is_code_object(value):
            continue
        chosen.append((name, value))
    if len(chosen) > MAX_LOCALS:
        chosen.sort(key=lambda item: 0 if _kind(item[1]) else 1)
        chosen = chosen[:MAX_LOCALS]
    out: dict[str, Any] = {}
    for name, value in chosen:
        out[name] = {"type": "secret", "text": SCRUBBED} if is_secret_name(name) else summarize(value, cuda_usable=cuda_usable)
    return out


def _is_code_object(value: Any) -> bool:
    return isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)) or (
        inspect.isclass(value)
    )


def _kind(value: Any) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return "Tensor"
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            return "module"
        data = sys.modules.get("torch.utils.data")
        if data is not None and isinstance(value, data.DataLoader):
            return "dataloader"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "ndarray"
    return None


def _find_live_objects(live: ProbeContext, frames: list[types.FrameType], tracker) -> Any:
    """The failing module and its arguments, the model, loader and optimizer, from the tracker or the stack.
    Returns the outermost module whose forward was running (None when none was)."""
    torch = sys.modules.get("torch")
    if tracker is not None:
        live.model, live.loader, live.optimizer = tracker.model, tracker.loader, tracker.optimizer
        live.loss_fn, live.batch, live.batch_index = tracker.loss_fn, tracker.batch, tracker.batch_index
        live.step = tracker.steps if (tracker.steps or tracker.batches_seen) else None
    if torch is None:
        return None
    # Forward calls only: a module's other methods (load_state_dict, to, __getattr__) are not a layer's call.
    module_frames = []
    for caller, frame in zip([None, *frames], frames):
        owner = frame.f_locals.get("self") if frame.f_code.co_argcount else None
        if (isinstance(owner, torch.nn.Module) and frame.f_code.co_name not in _MODULE_CALL_FUNCTIONS
                and caller is not None and _is_module_call_frame(caller)):
            module_frames.append((frame, owner))
    # A loss called as a module (`criterion(logits, y)`) is the loss function, never the model.
    loss_type = getattr(getattr(torch.nn, "modules", None), "loss", None)
    loss_type = getattr(loss_type, "_Loss", ())
    if module_frames:
        frame, module = module_frames[-1]
        live.module = module
        live.module_args, live.module_kwargs = _call_arguments(frame)
        models = [owner for _frame, owner in module_frames if not isinstance(owner, loss_type)]
        if live.model is None and models:
            live.model = models[0]
        if live.loss_fn is None and isinstance(module_frames[0][1], loss_type):
            live.loss_fn = module_frames[0][1]
        live.module_name = _module_name(live.model, module) if live.model is not None else type(module).__name__
    data = sys.modules.get("torch.utils.data")
    if live.model is None or live.loader is None or live.optimizer is None:
        for frame in reversed(frames):
            if not is_user_path(frame.f_code.co_filename):
                continue
            try:
                values = list(frame.f_locals.values())
            except Exception:
                continue
            for value in values:
                if isinstance(value, loss_type):
                    live.loss_fn = live.loss_fn or value
                elif live.model is None and isinstance(value, torch.nn.Module) and _is_bigger(value, live.model):
                    live.model = value
                elif live.optimizer is None and isinstance(value, torch.optim.Optimizer):
                    live.optimizer = value
                elif live.loader is None and data is not None and isinstance(value, data.DataLoader):
                    live.loader = value
    return module_frames[0][1] if module_frames else None


def _failing_layer_note(live: ProbeContext, cuda_usable: bool) -> str:
    """`the failing layer is fc1 (Linear), called with tensor[8, 400] float32 ...`: tensors only, never a raw repr."""
    name = f"{live.module_name} ({type(live.module).__name__})" if live.module_name else type(live.module).__name__
    torch = sys.modules["torch"]
    shown = []
    for arg in live.module_args[:4]:
        is_tensor = isinstance(arg, torch.Tensor) or (
            isinstance(arg, (tuple, list)) and arg and all(isinstance(item, torch.Tensor) for item in arg[:4]))
        if is_tensor:
            shown.append(summarize(arg, cuda_usable=cuda_usable)["text"])
    return f"the failing layer is {name}" + (f", called with {', '.join(shown)}" if shown else "")


def _is_module_call_frame(frame: types.FrameType) -> bool:
    """torch's own frame between a module call and its forward (`_call_impl`, its `inner` with hooks, the tracer's)."""
    code = frame.f_code
    path = code.co_filename.replace("\\", "/")
    return code.co_name in _FORWARD_CALLERS and path.endswith("torch/nn/modules/module.py")


def _is_layer(module, outermost, tracker) -> bool:
    """Whether the innermost module call is a layer worth naming: not a loss, and not the model's own top-level
    call (a failure in the model's own forward code, outside its layers), unless it is a leaf layer called alone."""
    if isinstance(module, sys.modules["torch"].nn.modules.loss._Loss):
        return False
    if module is outermost or (tracker is not None and module is tracker.model):
        return not any(True for _ in module.children())
    return True


def _is_bigger(candidate, current) -> bool:
    if current is None:
        return True
    try:
        return sum(p.numel() for p in candidate.parameters()) > sum(p.numel() for p in current.parameters())
    except Exception:
        return False


def _call_arguments(frame: types.FrameType) -> tuple[tuple, dict[str, Any]]:
    """The arguments a method frame was called with (as they are now), without `self`."""
    code = frame.f_code
    values = frame.f_locals
    positional = code.co_varnames[: code.co_argcount]
    keyword_only = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    args = [values[name] for name in positional[1:] if name in values]
    index = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(values.get(code.co_varnames[index], ()))
        index += 1
    kwargs = {name: values[name] for name in keyword_only if name in values}
    if code.co_flags & inspect.CO_VARKEYWORDS:
        extra = values.get(code.co_varnames[index], {})
        if isinstance(extra, dict):
            kwargs.update(extra)
    return tuple(args), kwargs


def _module_name(model, module) -> str | None:
    if model is None or module is None:
        return None
    if model is module:
        return ""
    try:
        for count, (name, candidate) in enumerate(model.named_modules()):
            if candidate is module:
                return name
            if count > MAX_MODULES_SEARCHED:
                break
    except Exception:
        pass
    return None


def _add_facts(live: ProbeContext, tracker, outermost: Any = None) -> None:
    facts = live.incident.facts
    if tracker is not None and (tracker.batches_seen or tracker.steps):
        facts["progress"] = {"batches": tracker.batches_seen, "optimizer_steps": tracker.steps, "batch_index": tracker.batch_index}
    cuda_usable = not facts.get("cuda_poisoned")
    if live.model is not None:
        model = summarize_module(live.model)
        facts["model"] = model
        device_outliers = [line for line in model.get("outliers", []) if " is on " in line]
        if device_outliers:
            facts["device_outliers"] = device_outliers
    if live.module is not None:
        inputs = [summarize(arg, cuda_usable=cuda_usable)["text"] for arg in live.module_args[:4]]
        facts["module"] = {"class": type(live.module).__name__, "name": live.module_name, "inputs": inputs}
        if live.module is not live.model:
            outliers = summarize_module(live.module).get("outliers")
            if outliers:
                facts["module"]["outliers"] = outliers
        if _is_layer(live.module, outermost, tracker):
            live.incident.notes.append(_failing_layer_note(live, cuda_usable))
    for outlier in facts.get("device_outliers", [])[:3]:
        live.incident.notes.append(outlier)
    if live.loader is not None:
        facts["loader"] = summarize_loader(live.loader)
    if live.optimizer is not None:
        facts["optimizer"] = summarize_optimizer(live.optimizer)
    if live.batch is not None:
        facts["batch"] = summarize(live.batch, cuda_usable=cuda_usable)
