"""--list_backends: every registered backend, whether it runs here, and
what it claims, read from the registry and the backend's declarations
(lcab.backend.Backend). Importing a backend's class imports its
framework; nothing is compiled or run.
"""

from __future__ import annotations

from lcab import registry


def text(framework: str = "all", suite: str | None = None,
         options: tuple[tuple[str, str, str], ...] = ()) -> str:
    """The listing of the backends of `framework` ("all": every one) and
    `suite` (None: every suite), each built with its --backend_options."""
    names = registry.backend_names(framework=framework, suite=suite)
    if not names:
        return f"no backends registered for --framework={framework}" + (
            f" --suite={suite}" if suite else "")
    blocks = []
    for name in names:
        given = {key: value for backend, key, value in options if backend == name}
        blocks.append(_describe(name, given))
    return "\n".join(blocks)


def _describe(name: str, options: dict[str, str]) -> str:
    entry = registry.all_backends()[name]
    head = f"{name}  framework={registry.framework_of(name)}  suite={entry.suite}"
    try:  # an instance, where one starts: some claims follow its options or device
        declared = registry.load_backend(name, options)
        where = "available"
    except registry.Unavailable as exc:
        where = f"UNAVAILABLE: {exc}"
        try:
            declared = entry.load()
        except Exception:  # noqa: BLE001 - the import's failure is the reason above
            return f"{head}  {where}"
    return "\n".join([f"{head}  {where}", *(f"    {line}" for line in _claims(declared))])


def _listed(value, none: str) -> str:
    """A claimed tuple as text; `none` for None, and a claim only an
    instance knows (a property on the class) says so."""
    if value is None:
        return none
    if isinstance(value, property):
        return "set when it starts (it cannot start here)"
    return ", ".join(map(str, sorted(value) if isinstance(value, frozenset) else value))


def _claims(declared) -> list[str]:
    """What the backend (an instance, or its class) declares it runs, one fact a line."""
    gqa = {True: "yes", False: "no (heads_q == heads_kv)"}.get(declared.gqa, "per workload")
    options = ", ".join(f"{key} ({kind.__name__})" for key, kind in declared.options.items())
    masks = _listed(declared.claimed_masks, "none declared; supports() decides per workload")
    lines = [
        f"masks: {masks}",
        f"directions: {_listed(declared.directions, 'none')}",
        f"dtypes: {_listed(declared.dtypes, 'none')}",
        f"head_dims: {_listed(declared.head_dims, 'any')}; GQA: {gqa}; layout: {declared.layout}",
        f"options: {options or 'none'}",
    ]
    if declared.strategy:
        lines.insert(0, f"strategy: {declared.strategy}")
    if declared.description:
        lines.insert(0, declared.description)
    if not declared.in_default_sweep:
        lines.append("runs only when named in --backends")
    return lines
