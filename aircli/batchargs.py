"""airbatch's command line read without click, for the forms it is given every day (importing click is
about a third of airbatch's start). Pure: argv in, the parameters click would give the command out, or
None where click must read it: help, an option not in the table (a typo, one of Slurm's), `--`, short
flags run together, a value that looks like an option, shell completion. tests/test_batchargs.py holds
it to click's own reading of the same argv."""
from __future__ import annotations

from air.aircli.options import FLAG_KINDS, OPTIONS

# airbatch's own options beside the table's: (click's parameter name, takes a value, click's default)
EXTRA = {"--parsable": ("parsable", False, False), "--test-only": ("test_only", False, False),
         "--wrap": ("wrap", True, None), "--config": ("config", True, None)}
_BY_NAME: dict[str, tuple[str, bool, object]] = dict(EXTRA)
for _opt in OPTIONS:
    _param = (_opt.long[2:].replace("-", "_"), _opt.kind not in FLAG_KINDS, None)
    _BY_NAME[_opt.long] = _param
    if _opt.short:
        _BY_NAME[_opt.short] = _param


def defaults() -> dict[str, object]:
    return {name: default for name, _, default in _BY_NAME.values()} | {"script": None, "args": ()}


def parse(argv: list[str]) -> dict[str, object] | None:
    params = defaults()
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":   # the script: it and all after it are its own
            params["script"], params["args"] = token, tuple(argv[i + 1:])
            return params
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            value = inline if eq else None
        else:
            name, value = token[:2], token[2:] or None
        known = _BY_NAME.get(name)
        if known is None:
            return None
        param, takes_value, _ = known
        if not takes_value:
            if value is not None:   # (`--hold=1`, `-Hv`: click's to say or to split)
                return None
            params[param] = True
        else:
            if value is None:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    return None
                i += 1
                value = argv[i]
            params[param] = value
        i += 1
    return params
