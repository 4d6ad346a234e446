"""Shadow execution: a sampled step of the unmodified program recomputed by a trusted path and compared.

Both detectors are drop-in: they need nothing from the reproducer, and they leave what the program computes as it
was. A recomputation works on copies: of the inputs (detached), of the module's parameters (detached
``nn.Parameter``s, so that ``.grad`` and the parameters' own hooks are untouched) and of its buffers (BatchNorm's
running statistics, which a forward in training mode updates in place, and whose version the program's backward
checks), under the program's random state, saved and put back. Gradients come from ``torch.autograd.grad`` with
respect to those copies.

A difference is ``|a - b| / max(|b|, 1 % of the largest |b| compared)`` (Euclidean norms, float64) of each floating
output or gradient; a gradient one path has and the other lacks is compared with zeros. The tolerance of a call site
is learned from its first ``warmup_samples`` samples (``learned_factor`` times the largest difference, at least
``floor``) and never exceeds the bound of the lowest precision the recomputation computed in (``DTYPE_BOUNDS``,
overridden by ``bounds``): a difference above that bound is an alarm even during the warmup. A reference that is
itself not finite is not compared. A site that cannot be recomputed faithfully is left unchecked, said once on
stderr, never with an alarm (which would count as a detection).
"""
import math
import sys
import weakref

from .base import DROP_IN, DetectorPlugin, register

# Relative error no correct kernel of each precision reaches on one layer or one compiled graph: float32 rounding
# is ~6e-8 a step and a reduction over n terms grows it ~sqrt(n); bfloat16 keeps 8 bits of mantissa (4e-3).
DTYPE_BOUNDS = {"float64": 1e-9, "float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2, "float8_e4m3fn": 0.25,
                "float8_e4m3fnuz": 0.25, "float8_e5m2": 0.5, "float8_e5m2fnuz": 0.5}
SMALL_SHARE = 0.01  # of the largest compared tensor's norm: the least a relative error is measured against
PROJECTION_SEED = 20_240_601  # the fixed random direction the outputs are projected on before backward


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


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


def compare(named_values, named_references):
    """(name, relative error) of each pair whose reference is finite; a None on one side (a gradient one path did
    not produce) stands for zeros. A reference under ``SMALL_SHARE`` of the largest one's norm is measured against
    that share: a gradient that is rounding noise around zero (a bias before a normalization) differs from its twin
    by ~100 % without anything being wrong."""
    import torch

    pairs = []
    for (name, value), (_, reference) in zip(named_values, named_references):
        if value is None and reference is None:
            continue
        value = torch.zeros_like(reference) if value is None else value
        reference = torch.zeros_like(value) if reference is None else reference
        pairs.append((name, value, reference))
    norms = [reference.detach().double().norm().item() for _, _, reference in pairs]
    largest = max((norm for norm in norms if math.isfinite(norm)), default=0.0)
    errors = []
    for name, value, reference in pairs:
        error = relative_error(value, reference, SMALL_SHARE * largest)
        if error is not None:
            errors.append((name, error))
    return errors


class Tolerance:
    """One call site's tolerance, learned from its first samples (the module docstring)."""

    def __init__(self, config):
        self.warmup = int(config["warmup_samples"])
        self.factor = float(config["learned_factor"])
        self.floor = float(config["floor"])
        self.bounds = bounds_of(config)
        self.seen = []

    def threshold(self, dtype):
        bound = self.bounds.get(dtype_name(dtype), self.bounds["float32"])
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


def bounds_of(config):
    return {**DTYPE_BOUNDS, **config["bounds"]}


def floating_leaves(tree):
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


def detached_copy(tree):
    """``tree`` with every tensor replaced by a detached copy (same strides where the layout allows) that requires
    grad as the original did."""
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
    terms = [(output.double() * torch.randn(output.shape, generator=generator, dtype=torch.float64, device="cpu")
              .to(output.device)).sum() for output in outputs if output.requires_grad]
    if not terms or not wrt:
        return None
    return torch.autograd.grad(sum(terms), wrt, allow_unused=True)


def alarm_beyond(probe, rule, site, beyond, threshold, dtype):
    worst = max(beyond, key=lambda pair: pair[1])
    probe.alarm(rule, f"{site}: {worst[0]} differs from the trusted path by {worst[1]:.3g} (relative), above "
                f"{threshold:.3g}", {"site": site, "dtype": dtype_name(dtype), "threshold": threshold,
                                     "differences": {name: error for name, error in beyond[:20]}})


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

    def lowest(self, dtype, bounds):
        """The least precise of ``dtype`` and those seen (the one with the widest bound)."""
        return max({dtype, *self.seen}, key=lambda seen: bounds.get(dtype_name(seen), 0.0))


class Torch:
    """The parts of torch the shadows use that older releases lack (the catalog runs torch 2.2 and 2.3 too),
    resolved once."""

    def __init__(self):
        import torch

        self.torch = torch
        compiler = getattr(torch, "compiler", None)
        self.is_compiling = (getattr(compiler, "is_compiling", None) or getattr(torch._dynamo, "is_compiling", None)
                             or (lambda: False))
        self.set_stance = getattr(compiler, "set_stance", None)  # torch 2.6: a replay must not recompile
        self._top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)

    def saved_tensors_hooked(self):
        """Whether saved-tensor hooks are on (activation checkpointing counts what a forward saves); unknown on an
        old torch counts as yes."""
        return self._top_hooks is None or self._top_hooks(False) is not None

    def autocast(self, device):
        """(enabled, dtype) of autocast on ``device`` now."""
        torch = self.torch
        try:
            return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        except (AttributeError, TypeError):  # before torch 2.4: one function per device kind
            if device == "cpu":
                return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
            return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()

    def random_state(self):
        """The random state of the CPU and of every CUDA device in use."""
        torch = self.torch
        return torch.random.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)

    def set_random_state(self, state):
        cpu, cuda = state
        self.torch.random.set_rng_state(cpu)
        if cuda is not None:
            self.torch.cuda.set_rng_state_all(cuda)

    def seed_every_device(self, seed):
        """Seed the CPU and the CUDA devices in use (not the others: a lazy seed would outlive a fork_rng)."""
        self.torch.random.default_generator.manual_seed(seed)
        if self.torch.cuda.is_initialized():
            self.torch.cuda.manual_seed_all(seed)

    def random_state_kept(self):
        """Around a recomputation: the random state of the CPU and of every CUDA device in use, put back on exit."""
        torch = self.torch
        return torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else [])


class Snapshot:
    """A compiled module's call, copied before it runs: its inputs, parameters and buffers (a forward that changes
    an input or a buffer in place must not change them a second time in the recomputation). ``path()`` makes the
    module compute with fresh copies of them (detached ``nn.Parameter``s, as compiled code expects; a weight
    shared by two names, tied, stays one copy) and yields the copied inputs and the parameters that require grad."""

    def __init__(self, module, args, kwargs):
        self.module, self.inputs = module, detached_copy((args, kwargs))
        self.names = {}  # id of a parameter or buffer: its names
        self.values = {}  # id: a detached copy, and whether it is a parameter that requires grad
        for kind, named in (("param", module.named_parameters(remove_duplicate=False)),
                            ("buffer", module.named_buffers(remove_duplicate=False))):
            for name, value in named:
                self.names.setdefault(id(value), []).append(name)
                self.values[id(value)] = (value.detach().clone(), kind == "param", value.requires_grad)

    def path(self):
        import torch
        from torch.nn.utils.stateless import _reparametrize_module

        copies = {key: (torch.nn.Parameter(value.clone(), requires_grad=grad) if is_param else value.clone())
                  for key, (value, is_param, grad) in self.values.items()}
        swapped = {name: copies[key] for key, names in self.names.items() for name in names}
        snapshot = self

        class Path:
            def __enter__(self):
                self.context = _reparametrize_module(snapshot.module, swapped)
                self.context.__enter__()
                params = [value for value in copies.values() if isinstance(value, torch.nn.Parameter)
                          and value.requires_grad]
                return detached_copy(snapshot.inputs), params

            def __exit__(self, *exc):
                return self.context.__exit__(*exc)

        return Path()


def hooked(module):
    """Whether a recomputation of ``module`` would run hooks of the program's (its modules' forward hooks, or global
    ones): they would see the copies, and run once more than the program ran them."""
    from torch.nn.modules import module as modules

    hooks = ("_forward_hooks", "_forward_pre_hooks")
    return (any(getattr(modules, f"_global{name}", None) for name in hooks)
            or any(getattr(child, name, None) for child in module.modules() for name in hooks))


@register
class ShadowEager(DetectorPlugin):
    name = "shadow_eager"
    blind_beside_others = True  # a module that global forward hooks watch (other detectors') is left unchecked
    version = "1"
    integration = DROP_IN
    in_quickstart = False
    description = (
        "Where the program compiles a module with torch.compile (or Module.compile()), the first call of every "
        "`every_n_steps`-th step is run again eagerly, on copies of its inputs, weights and buffers taken before "
        "the call, and compared "
        "with the compiled outputs; its projected gradients are compared with those of a replay of the compiled "
        "graph on the same copies. A relative difference above the tolerance learned over the first "
        "`warmup_samples` samples (x `learned_factor`, at least `floor`), or above the bound of the lowest "
        "precision computed in, is an alarm. A module that draws random numbers (dropout) in the mode it runs in "
        "or has forward hooks, and a compiled function (whose side effects could not be undone), are left "
        "unchecked."
    )
    default_config = {"every_n_steps": 4, "warmup_samples": 2, "learned_factor": 10.0, "floor": 1e-5, "bounds": {}}

    def install(self, probe):
        import functools

        import torch

        config = probe.config
        every = max(1, int(config["every_n_steps"]))
        bounds, compat = bounds_of(config), Torch()
        original_compile = torch.compile
        sites = []

        def shadowed(compiled, eager, module, site):
            tolerance = Tolerance(config)
            random_by_mode, sampled_at, skipped, replay_failed = {}, [], [], []

            @functools.wraps(compiled)
            def call(*args, **kwargs):
                if skipped or compat.is_compiling() or probe.step % every or probe.step in sampled_at:
                    return compiled(*args, **kwargs)
                sampled_at[:] = [probe.step]
                try:
                    if hooked(module):
                        skipped.append(True)
                        unchecked(site, "its modules have hooks, which a recomputation would run once more")
                        return compiled(*args, **kwargs)
                    state, snapshot = compat.random_state(), Snapshot(module, args, kwargs)
                except Exception as error:  # noqa: BLE001 - the program's call goes on, unchecked
                    skipped.append(True)
                    unchecked(site, repr(error))
                    return compiled(*args, **kwargs)
                output = compiled(*args, **kwargs)
                try:
                    check(snapshot, output, state)
                except Exception as error:  # noqa: BLE001 - the program's call succeeded: it goes on, unchecked
                    skipped.append(True)
                    unchecked(site, repr(error))
                return output

            def check(snapshot, output, state):
                outputs = floating_leaves(output)
                if not outputs:
                    return
                backward = torch.is_grad_enabled() and any(value.requires_grad for value in outputs)
                with compat.random_state_kept(), DtypesComputed() as precisions:  # from the program's random state
                    compat.set_random_state(state)
                    eager_outputs, eager_grads = run_path(eager, snapshot, backward)
                if draws_random_numbers(snapshot, eager_outputs):
                    skipped.append(True)
                    unchecked(site, "it draws random numbers, which compiled code draws otherwise than eager")
                    return
                errors = compare([(f"output {i}", value) for i, value in enumerate(outputs)],
                                 [(f"output {i}", value) for i, value in enumerate(eager_outputs)])
                if backward and compat.set_stance is not None and not replay_failed:
                    try:
                        with compat.random_state_kept(), compat.set_stance("fail_on_recompile"):
                            compat.set_random_state(state)
                            _, compiled_grads = run_path(compiled, snapshot, backward)
                    except Exception as error:  # noqa: BLE001 - the outputs are still compared
                        replay_failed.append(True)
                        unchecked(f"{site}'s gradients", f"its compiled graph cannot be replayed: {error!r}")
                    else:
                        errors += compare([(f"gradient {i}", grad) for i, grad in enumerate(compiled_grads or ())],
                                          [(f"gradient {i}", grad) for i, grad in enumerate(eager_grads or ())])
                precision = precisions.lowest(outputs[0].dtype, bounds)  # a float32 head over bf16 layers: bf16
                beyond, threshold = tolerance.judge(errors, precision)
                if beyond:
                    alarm_beyond(probe, "compiled_differs_from_eager", site, beyond, threshold, precision)

            def draws_random_numbers(snapshot, eager_outputs):
                """Whether the eager path gives other outputs from another random state, asked once for each of
                the module's modes (a validation pass in eval mode may come before training)."""
                mode = module.training
                if mode not in random_by_mode:
                    with compat.random_state_kept():
                        compat.seed_every_device(PROJECTION_SEED)
                        redrawn, _ = run_path(eager, snapshot, backward=False)
                    random_by_mode[mode] = any(error > 0 for _, error in compare(list(enumerate(redrawn)),
                                                                                 list(enumerate(eager_outputs))))
                return random_by_mode[mode]

            def run_path(function, snapshot, backward):
                """``function``'s floating outputs on fresh copies of the snapshot, and (when ``backward``) their
                projected gradients with respect to those copies."""
                with torch.enable_grad() if backward else torch.no_grad(), snapshot.path() as (inputs, params):
                    outputs = floating_leaves(function(*inputs[0], **inputs[1]))
                    if not backward:
                        return outputs, None
                    wrt = [leaf for leaf in floating_leaves(inputs) if leaf.requires_grad] + params
                    return outputs, projected_gradients(outputs, wrt)

            return call

        def compile_with_shadow(model=None, **options):
            if model is None:  # @torch.compile(mode=...): a decorator
                return lambda target: compile_with_shadow(target, **options)
            compiled = original_compile(model, **options)
            if compiled is model:  # disable=True, or compiling while exporting: nothing was compiled
                return compiled
            site = f"compiled {getattr(model, '__qualname__', type(model).__name__)} #{len(sites)}"
            sites.append(site)
            if isinstance(model, torch.nn.Module):  # keep the OptimizedModule: only its forward is shadowed
                compiled.forward = shadowed(compiled.forward, model.__call__, model, site)
                return compiled
            owner = getattr(model, "__self__", None)  # Module.compile() compiles its bound _call_impl
            if isinstance(owner, torch.nn.Module):
                return shadowed(compiled, model, owner, site)
            unchecked(site, "a compiled function is not shadowed: running it again could repeat its side effects")
            return compiled

        torch.compile = compile_with_shadow


@register
class ShadowPrecise(DetectorPlugin):
    name = "shadow_precise"
    version = "1"
    integration = DROP_IN
    in_quickstart = False
    description = (
        "Every `every_n_steps`-th step, up to `layers_per_step` layers (modules with parameters and no submodules, "
        "those checked least recently first) are recomputed from copies of their inputs and weights: once at the "
        "program's precision, which must give the program's own output bit for bit (else the layer draws random "
        "numbers or changed its input, and is left unchecked), and once in float64 with autocast off. The "
        "program's output is compared with the float64 one, and the two recomputations' projected gradients with "
        "each other; a relative difference above the tolerance learned over each layer's first `warmup_samples` "
        "samples (x `learned_factor`, at least `floor`), or above the bound of the lowest precision the layer "
        "computed in, is an alarm. Once the program calls torch.compile nothing more is checked; layers under "
        "activation checkpointing are not checked."
    )
    default_config = {"every_n_steps": 4, "layers_per_step": 4, "warmup_samples": 2, "learned_factor": 10.0,
                      "floor": 1e-5, "bounds": {}}

    def install(self, probe):
        import torch
        from torch.nn.modules.module import register_module_forward_hook

        config = probe.config
        every, per_step = max(1, int(config["every_n_steps"])), max(1, int(config["layers_per_step"]))
        bounds, compat = bounds_of(config), Torch()
        # by layer: its tolerance, the step it was last checked at (-1: never), its number in the order first seen
        tolerances, last_checked, numbers = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary(), {}
        seen_at = weakref.WeakKeyDictionary()  # by layer: the last sampled step it was called in
        checked_at = {"step": -1, "layers": 0}

        def number(module):
            return numbers.setdefault(id(module), len(numbers))

        def due(module):
            """A layer's turn: on a sampled step, those checked least recently first, up to the quota."""
            step = probe.step
            if step % every:
                return False
            if checked_at["step"] != step:
                checked_at.update(step=step, layers=0)
            last = last_checked.setdefault(module, -1)
            seen_at[module] = step
            number(module)
            # the least recently checked among the layers that still run (seen this round or the last): a layer
            # that stopped being called (eval only, an expert no token reaches) must not hold the others back
            running = [checked for layer, checked in last_checked.items() if seen_at.get(layer, -1) >= step - every]
            if checked_at["layers"] >= per_step or last == step or last > min(running):
                return False
            checked_at["layers"] += 1
            last_checked[module] = step
            return True

        def recompute(module, args, kwargs, precise):
            """The layer's output from copies of its inputs and weights (its forward alone: its hooks stay out),
            the projected gradients, and the lowest precision computed in."""
            def cast(tensor):
                copy = tensor.detach().clone()
                if precise and copy.is_floating_point():
                    copy = copy.double()
                return copy.requires_grad_(tensor.requires_grad and copy.is_floating_point())

            from torch.nn.utils.stateless import _reparametrize_module
            from torch.utils._pytree import tree_map

            weights = {name: torch.nn.Parameter(cast(value), requires_grad=value.requires_grad)
                       for name, value in module.named_parameters(recurse=False)}
            weights.update({name: cast(value) for name, value in module.named_buffers(recurse=False)})
            inputs = tree_map(lambda leaf: cast(leaf) if isinstance(leaf, torch.Tensor) else leaf, (args, kwargs))
            device = next((leaf.device.type for leaf in floating_leaves(inputs)), "cpu")
            enabled, dtype = compat.autocast(device)
            precisions = DtypesComputed()
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled and not precise), \
                    _reparametrize_module(module, weights), precisions:
                output = module.forward(*inputs[0], **inputs[1])
            if not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return None, None, None
            wrt = [leaf for leaf in floating_leaves(inputs) if leaf.requires_grad]
            wrt += [value for value in weights.values() if value.requires_grad]
            grads = projected_gradients([output], wrt) if output.requires_grad else None
            return output, grads, precisions.lowest(output.dtype, bounds)

        def check(module, args, kwargs, output):
            with compat.random_state_kept():
                again, grads, precision = recompute(module, args, kwargs, precise=False)
            if again is None or not torch.equal(again.detach(), output):
                unchecked(f"{type(module).__name__} #{number(module)}",
                          "its recomputation does not give its output (random numbers, or an input changed in place)")
                return
            with compat.random_state_kept():
                precise_output, precise_grads, _ = recompute(module, args, kwargs, precise=True)
            errors = compare([("output", output)], [("output", precise_output)])
            if grads is not None or precise_grads is not None:
                errors += compare([(f"gradient {i}", grad) for i, grad in enumerate(grads or ())],
                                  [(f"gradient {i}", grad) for i, grad in enumerate(precise_grads or ())])
            tolerance = tolerances.setdefault(module, Tolerance(config))
            beyond, threshold = tolerance.judge(errors, precision)
            if beyond:
                alarm_beyond(probe, "layer_differs_from_float64", f"{type(module).__name__} #{number(module)}",
                             beyond, threshold, precision)

        def hook(module, args, kwargs, output):
            try:
                if (compat.is_compiling() or not isinstance(output, torch.Tensor) or not output.is_floating_point()
                        or next(module.children(), None) is not None
                        or next(module.parameters(recurse=False), None) is None
                        or isinstance(module, torch.nn.RNNBase)):
                    return None
                if compat.saved_tensors_hooked():
                    # torch.utils.checkpoint's hooks count what a forward saves, and fail the program's backward
                    # when its recomputation saves otherwise: a checkpointed layer is not checked
                    unchecked(type(module).__name__, "it runs under saved-tensor hooks (activation checkpointing)")
                    return None
                if due(module):
                    check(module, args, kwargs, output.detach())
            except Exception as error:  # noqa: BLE001 - the program's call succeeded: it goes on, unchecked here
                unchecked(type(module).__name__, repr(error))
            return None

        try:
            handles = [register_module_forward_hook(hook, with_kwargs=True)]
        except TypeError:  # before torch 2.4 a global hook gets no keyword arguments
            handles = [register_module_forward_hook(lambda module, args, output: hook(module, args, {}, output))]
        original_compile = torch.compile

        def compile_unhooked(*args, **kwargs):
            """A program that compiles is not checked from then on: the global hook would be traced into its
            graphs, and under a stance that forbids recompiling (skip_guard_eval_unsafe) it fails the call."""
            if handles:
                handles.pop().remove()
                unchecked("the program", "it calls torch.compile: shadow_precise checks nothing from then on")
            return original_compile(*args, **kwargs)

        torch.compile = compile_unhooked
