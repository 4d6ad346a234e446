"""Shadow execution: a sampled step of the unmodified program recomputed by a trusted path and compared.

Both detectors are drop-in: they need nothing from the reproducer, and they leave what the program computes as it
was. The recomputation works on detached copies of the inputs and weights and on copies of a module's buffers
(BatchNorm's running statistics), under a saved and restored random state; its gradients come from
``torch.autograd.grad``, which accumulates nothing into ``.grad``.

A difference is the relative error ``|a - b| / |b|`` (Euclidean norms) of each floating output or gradient. The
tolerance for one call site is learned from its first ``warmup_samples`` samples, ``learned_factor`` times the
largest error seen there, never below ``floor`` and never above the bound of the output's dtype (``bounds``): a
difference above the bound is an alarm even during the warmup, since no correct kernel of that precision is that
far off. A site whose reference is itself not finite is not compared (the fault is not the path under test's).
"""
import math
import sys
from itertools import count

from .base import DROP_IN, DetectorPlugin, register

# Relative error no correct kernel of each precision reaches on one layer or one compiled graph: float32 rounding
# is ~6e-8 a step and a reduction over n terms grows it ~sqrt(n); bfloat16 keeps 8 bits of mantissa (4e-3).
DTYPE_BOUNDS = {"float64": 1e-9, "float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2, "float8_e4m3fn": 0.25,
                "float8_e4m3fnuz": 0.25, "float8_e5m2": 0.5, "float8_e5m2fnuz": 0.5}
SMALL_SHARE = 0.01  # of the largest compared tensor's norm: the least a relative error is measured against
PROJECTION_SEED = 20_240_601  # the fixed random direction the outputs are projected on before backward


def relative_error(value, reference, scale_floor=0.0):
    """``|value - reference| / max(|reference|, scale_floor)`` in float64; inf when ``value`` is not finite and
    ``reference`` is; None when ``reference`` itself is not finite."""
    import torch

    value, reference = value.detach().double(), reference.detach().double()
    if not bool(torch.isfinite(reference).all()):
        return None
    if not bool(torch.isfinite(value).all()):
        return math.inf
    scale = max(reference.norm().item(), scale_floor)
    difference = (value - reference).norm().item()
    return difference / scale if scale > 0 else difference


class Tolerance:
    """One call site's tolerance, learned from its first samples (the module docstring)."""

    def __init__(self, config):
        self.warmup = int(config["warmup_samples"])
        self.factor = float(config["learned_factor"])
        self.floor = float(config["floor"])
        self.bounds = {**DTYPE_BOUNDS, **config["bounds"]}
        self.seen = []

    def threshold(self, dtype):
        bound = self.bounds.get(str(dtype).removeprefix("torch."), DTYPE_BOUNDS["float32"])
        if len(self.seen) < self.warmup:
            return bound
        return min(bound, max(self.floor, self.factor * max(self.seen)))

    def judge(self, errors, dtype):
        """The comparisons (name, error) beyond the threshold; the errors join the warmup while it lasts."""
        threshold = self.threshold(dtype)
        beyond = [(name, error) for name, error in errors if error > threshold]
        if len(self.seen) < self.warmup and not beyond:
            self.seen.append(max((error for _, error in errors), default=0.0))
        return beyond, threshold


def floating_leaves(tree):
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


def detached_copy(tree):
    """``tree`` with every tensor replaced by a detached copy that requires grad as the original did."""
    import torch
    from torch.utils._pytree import tree_map

    def copy(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        duplicate = leaf.detach().clone()
        return duplicate.requires_grad_(leaf.requires_grad) if duplicate.is_floating_point() else duplicate

    return tree_map(copy, tree)


def projected_gradients(outputs, wrt):
    """Gradients of ``sum(output * direction)`` over the floating outputs, with respect to ``wrt``; the direction
    is the same random one for every path (a fixed seed, on a generator of its own)."""
    import torch

    generator = torch.Generator().manual_seed(PROJECTION_SEED)
    terms = [(output.double() * torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output.device))
             .sum() for output in outputs if output.requires_grad]
    if not terms or not wrt:
        return None
    return torch.autograd.grad(sum(terms), wrt, allow_unused=True)


def compare(named_values, named_references):
    """(name, relative error) of each pair whose reference is finite. A reference under ``SMALL_SHARE`` of the
    largest one's norm is measured against that share: a gradient that is rounding noise around zero (a bias
    before a normalization) differs from its twin by ~100 % without anything being wrong."""
    pairs = [(name, value, reference) for (name, value), (_, reference) in zip(named_values, named_references)
             if value is not None and reference is not None]
    norms = [reference.detach().double().norm().item() for _, _, reference in pairs]
    largest = max((norm for norm in norms if math.isfinite(norm)), default=0.0)
    errors = []
    for name, value, reference in pairs:
        error = relative_error(value, reference, SMALL_SHARE * largest)
        if error is not None:
            errors.append((name, error))
    return errors


def alarm_beyond(probe, rule, site, beyond, threshold, dtype):
    worst = max(beyond, key=lambda pair: pair[1])
    probe.alarm(rule, f"{site}: {worst[0]} differs from the trusted path by {worst[1]:.3g} (relative), above "
                f"{threshold:.3g}", {"site": site, "dtype": str(dtype).removeprefix("torch."),
                                     "threshold": threshold,
                                     "differences": {name: error for name, error in beyond[:20]}})


def sampled_step(probe, every, sampled_steps, key):
    """Whether this call of ``key`` is its first in a step that is a multiple of ``every``."""
    step = probe.step
    if step % every or sampled_steps.get(key) == step:
        return False
    sampled_steps[key] = step
    return True


_unchecked_sites = set()


def unchecked(site, why):
    """Say once on stderr that a site is not compared, and why (an alarm would count as a detection)."""
    if site not in _unchecked_sites:
        _unchecked_sites.add(site)
        print(f"SilentBench shadow: {site} left unchecked: {why}"[:500], file=sys.stderr)


class DtypesComputed:
    """While in it: the floating dtypes of every torch result (a layer that quantizes inside, FP8 emulation say,
    computes at a lower precision than its output's dtype, and is judged by that precision's bound)."""

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        seen = self.seen = set()

        class Recording(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                seen.update(leaf.dtype for leaf in floating_leaves(result))
                return result

        self.mode = Recording()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)

    def lowest(self, dtype):
        """The least precise of ``dtype`` and those seen (by the bound of each)."""
        return max({dtype, *self.seen}, key=lambda seen: DTYPE_BOUNDS.get(str(seen).removeprefix("torch."), 0.0))


def saved_tensors_hooked():
    import torch

    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def random_state_kept():
    """Around a recomputation: the random state of the CPU and of every CUDA device in use, put back on exit."""
    import torch

    return torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else [])


def buffers_copied(module):
    """While in it, ``module`` computes with copies of its buffers: a recomputation in training mode updates
    BatchNorm's running statistics in place, which would change the program's and bump the version that its
    graph's backward checks (even a copy put back bumps it)."""
    from contextlib import nullcontext

    from torch.nn.utils.stateless import _reparametrize_module

    if module is None:
        return nullcontext()
    return _reparametrize_module(module, {name: buffer.detach().clone() for name, buffer in module.named_buffers()})


@register
class ShadowEager(DetectorPlugin):
    name = "shadow_eager"
    version = "1"
    integration = DROP_IN
    description = (
        "Where the program calls torch.compile (on a module, a function, or Module.compile()), the first call of "
        "every `every_n_steps`-th step is run again eagerly on copies of the same inputs and weights, and compared "
        "with the compiled outputs and with the compiled graph's gradients (a replay of the same call, projected on "
        "a fixed random direction); a relative difference above the tolerance learned over the first "
        "`warmup_samples` samples (x `learned_factor`, at least `floor`), or above the output dtype's bound, is an "
        "alarm. Dropout inside the compiled graph draws other random numbers than eager mode does: such a program "
        "learns a wide tolerance."
    )
    default_config = {"every_n_steps": 4, "warmup_samples": 2, "learned_factor": 10.0, "floor": 1e-5, "bounds": {}}

    def install(self, probe):
        import functools

        import torch

        config = probe.config
        every = max(1, int(config["every_n_steps"]))
        sampled_steps = {}
        sites = count()
        original_compile = torch.compile

        def shadowed(compiled, eager, module, site):
            tolerance = Tolerance(config)
            random_checked, skipped = [], []

            @functools.wraps(compiled)
            def call(*args, **kwargs):
                if (torch.compiler.is_compiling() or skipped
                        or not sampled_step(probe, every, sampled_steps, site)):
                    return compiled(*args, **kwargs)
                state = torch.random.get_rng_state()
                output = compiled(*args, **kwargs)
                try:
                    check(args, kwargs, output, state)
                except Exception as error:  # noqa: BLE001 - the program's call succeeded: it goes on, unchecked here
                    unchecked(site, repr(error))
                return output

            def check(args, kwargs, output, state):
                outputs = floating_leaves(output)
                if not outputs:
                    return
                params = [p for p in (module.parameters() if module is not None else ()) if p.requires_grad]
                backward = torch.is_grad_enabled() and any(value.requires_grad for value in outputs)
                with random_state_kept(), DtypesComputed() as precisions:  # from the program's random state
                    torch.random.set_rng_state(state)
                    eager_outputs, eager_grads = run_path(eager, args, kwargs, params, backward, module)
                if not random_checked:  # once a site: a graph that draws random numbers (dropout) is not compared
                    random_checked.append(True)
                    with random_state_kept():
                        torch.manual_seed(PROJECTION_SEED)
                        redrawn, _ = run_path(eager, args, kwargs, params, False, module)
                    if any(error > 0 for _, error in compare(list(enumerate(redrawn)), list(enumerate(eager_outputs)))):
                        skipped.append(True)
                        unchecked(site, "it draws random numbers, which compiled code draws otherwise than eager")
                        return
                errors = compare([(f"output {i}", value) for i, value in enumerate(outputs)],
                                 [(f"output {i}", value) for i, value in enumerate(eager_outputs)])
                if eager_grads is not None:
                    with random_state_kept():
                        torch.random.set_rng_state(state)
                        _, compiled_grads = run_path(compiled, args, kwargs, params, backward, module)
                    if compiled_grads is not None:
                        errors += compare([(f"gradient {i}", grad) for i, grad in enumerate(compiled_grads)],
                                          [(f"gradient {i}", grad) for i, grad in enumerate(eager_grads)])
                precision = precisions.lowest(outputs[0].dtype)  # a float32 head over bfloat16 layers: bfloat16
                beyond, threshold = tolerance.judge(errors, precision)
                if beyond:
                    alarm_beyond(probe, "compiled_differs_from_eager", site, beyond, threshold, precision)

            return call

        def run_path(function, args, kwargs, params, backward, module):
            """``function``'s floating outputs on copies of the inputs, and (when ``backward``) their projected
            gradients with respect to those copies and ``params``."""
            inputs = detached_copy((args, kwargs))
            with torch.enable_grad() if backward else torch.no_grad(), buffers_copied(module):
                outputs = floating_leaves(function(*inputs[0], **inputs[1]))
            if not backward:
                return outputs, None
            wrt = [leaf for leaf in floating_leaves(inputs) if leaf.requires_grad] + params
            return outputs, projected_gradients(outputs, wrt)

        def compile_with_shadow(model=None, **options):
            if model is None:  # @torch.compile(mode=...): a decorator
                return lambda target: compile_with_shadow(target, **options)
            compiled = original_compile(model, **options)
            site = f"compiled {getattr(model, '__qualname__', type(model).__name__)} #{next(sites)}"
            if isinstance(model, torch.nn.Module):  # keep the OptimizedModule: only its forward is shadowed
                compiled.forward = shadowed(compiled.forward, model.__call__, model, site)
                return compiled
            owner = getattr(model, "__self__", None)  # Module.compile() compiles its bound _call_impl
            return shadowed(compiled, model, owner if isinstance(owner, torch.nn.Module) else None, site)

        torch.compile = compile_with_shadow


@register
class ShadowPrecise(DetectorPlugin):
    name = "shadow_precise"
    version = "1"
    integration = DROP_IN
    description = (
        "Every `every_n_steps`-th step, up to `layers_per_step` layers (modules with parameters and no submodules, "
        "taken in turn) are recomputed from copies of their inputs and weights: once at the program's precision, "
        "and once in float64 with autocast off. The program's own output is compared with the float64 one, and the "
        "gradients of both recomputations (projected on a fixed random direction) with each other; a relative "
        "difference above the tolerance learned over each layer's first `warmup_samples` samples (x "
        "`learned_factor`, at least `floor`), or above the bound of the lowest precision the layer computed in, "
        "is an alarm. Once the program calls torch.compile it is left to shadow_eager; layers under activation "
        "checkpointing are not checked."
    )
    default_config = {"every_n_steps": 4, "layers_per_step": 4, "warmup_samples": 2, "learned_factor": 10.0,
                      "floor": 1e-5, "bounds": {}}

    def install(self, probe):
        import torch
        from torch.func import functional_call
        from torch.nn.modules.module import register_module_forward_hook

        config = probe.config
        every, per_step = max(1, int(config["every_n_steps"])), max(1, int(config["layers_per_step"]))
        # by layer: its tolerance, the step it was last checked at, its number (in the order first checked)
        tolerances, last_checked, layers = {}, {}, {}
        checked_at = {"step": -1, "layers": 0}

        def due(module):
            """A layer's turn: on a sampled step, those checked least recently first, up to the quota."""
            step = probe.step
            if step % every:
                return False
            if checked_at["step"] != step:
                checked_at.update(step=step, layers=0)
            last = last_checked.get(id(module), -1)
            if checked_at["layers"] >= per_step or last == step or last > min(last_checked.values(), default=-1):
                return False
            checked_at["layers"] += 1
            last_checked[id(module)] = step
            layers.setdefault(id(module), len(layers))
            return True

        def recompute(module, args, precise):
            """The layer's output from detached copies of its inputs and weights, and the projected gradients."""
            def cast(tensor):
                copy = tensor.detach().clone()
                if precise and copy.is_floating_point():
                    copy = copy.double()
                return copy.requires_grad_(tensor.requires_grad and copy.is_floating_point())

            weights = {name: cast(value) for name, value in module.named_parameters(recurse=False)}
            weights.update({name: cast(value) for name, value in module.named_buffers(recurse=False)})
            inputs = tuple(cast(arg) if isinstance(arg, torch.Tensor) else arg for arg in args)
            device, precisions = args_device(args), DtypesComputed()
            with torch.enable_grad(), torch.autocast(device, dtype=torch.get_autocast_dtype(device),
                                                     enabled=not precise and torch.is_autocast_enabled(device)), \
                    precisions:
                output = functional_call(module, weights, inputs)
            if not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return None, None, None
            wrt = [value for value in (*inputs, *weights.values())
                   if isinstance(value, torch.Tensor) and value.requires_grad]
            grads = projected_gradients([output], wrt) if output.requires_grad else None
            return output, grads, precisions.lowest(output.dtype)

        def args_device(args):
            tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
            return tensors[0].device.type if tensors else "cpu"

        def check(module, args, output):
            with random_state_kept():
                precise_output, precise_grads, _ = recompute(module, args, precise=True)
            with random_state_kept():
                _, grads, precision = recompute(module, args, precise=False)
            if precise_output is None:
                return
            errors = compare([("output", output)], [("output", precise_output)])
            if grads is not None and precise_grads is not None:
                errors += compare([(f"gradient {i}", grad) for i, grad in enumerate(grads)],
                                  [(f"gradient {i}", grad) for i, grad in enumerate(precise_grads)])
            tolerance = tolerances.setdefault(id(module), Tolerance(config))
            beyond, threshold = tolerance.judge(errors, precision)
            if beyond:
                layer = f"{type(module).__name__} #{layers[id(module)]}"
                alarm_beyond(probe, "layer_differs_from_float64", layer, beyond, threshold, precision)

        def hook(module, args, output):
            if saved_tensors_hooked():
                # torch.utils.checkpoint's hooks count what a forward saves, and fail the program's backward when
                # its recomputation saves otherwise: a checkpointed layer is not checked
                unchecked(type(module).__name__, "it runs under saved-tensor hooks (activation checkpointing)")
                return None
            if (torch.compiler.is_compiling() or not isinstance(output, torch.Tensor)
                    or not output.is_floating_point() or next(module.children(), None) is not None
                    or next(module.parameters(recurse=False), None) is None
                    or isinstance(module, torch.nn.RNNBase) or not due(module)):
                return None
            try:
                check(module, args, output.detach())
            except Exception as error:  # noqa: BLE001 - the program's call succeeded: it goes on, unchecked here
                unchecked(type(module).__name__, repr(error))
            return None

        handle = register_module_forward_hook(hook)
        original_compile = torch.compile

        def compile_unhooked(*args, **kwargs):
            """A program that compiles is left to shadow_eager from then on: the global hook would be traced into
            its graphs, and under a stance that forbids recompiling (skip_guard_eval_unsafe) it fails the call."""
            handle.remove()
            return original_compile(*args, **kwargs)

        torch.compile = compile_unhooked
