"""Command lines read without click, for the forms the tools are given every day (importing click is
about a third of a short command's start). Pure: argv and a tool's option table in, the parameters
click would give the tool's command out, or None where click must read it: help, an option not in
the table (a typo, one of Slurm's), `--`, short flags run together, a value that looks like an
option, an argument the tool does not take. tests/test_argv.py holds it to click's own reading of
the same argv for each tool that uses it."""
from __future__ import annotations

from typing import NamedTuple


class Param(NamedTuple):
    """One option of a tool: click's parameter name for it, whether it takes a value, its default."""
    name: str
    takes_value: bool
    default: object = None


def table(options: list[tuple[tuple[str, ...], Param]]) -> dict[str, Param]:
    """{every name of an option ("-u", "--user"): its Param}."""
    return {name: param for names, param in options for name in names}


def rows_table(rows) -> dict[str, Param]:
    """table() of a tool's rows of (names, parameter name, takes a value, help): a flag's default is
    False, a value's None, as click's."""
    return table([(names, Param(name, takes_value, None if takes_value else False))
                  for names, name, takes_value, _ in rows])


def read(argv: list[str], options: dict[str, Param], script: bool = False,
         positional: str | None = None) -> dict[str, object] | None:
    """The parameters for argv; `script`: the tool takes a script and its arguments (`script`, `args`)
    after its options, as airbatch does (click's allow_interspersed_args=False); `positional`: the name
    of the arguments the tool takes among its options, all of them (click's nargs=-1), as aircancel's
    job ids."""
    params = {p.name: p.default for p in options.values()} | ({"script": None, "args": ()} if script else {})
    arguments: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":   # the script: it and all after it are its own
            if positional is not None:
                arguments.append(token)
                i += 1
                continue
            if not script:
                return None
            params["script"], params["args"] = token, tuple(argv[i + 1:])
            return params
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            value = inline if eq else None
        else:
            name, value = token[:2], token[2:] or None
        param = options.get(name)
        if param is None:
            return None
        if not param.takes_value:
            if value is not None:   # (`--hold=1`, `-Hv`: click's to say or to split)
                return None
            params[param.name] = True
        else:
            if value is None:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    return None
                i += 1
                value = argv[i]
            params[param.name] = value
        i += 1
    if positional is not None:
        params[positional] = tuple(arguments)
    return params


def completing(prog: str, environ) -> bool:
    """Whether click's shell completion asks (its variable, named as click names it)."""
    return f"_{prog}_COMPLETE".replace("-", "_").replace(".", "_").upper() in environ
