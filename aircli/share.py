"""airshare: the account tree with shares, usage and fairshare factors, as sshare shows them."""
from __future__ import annotations

import json
import sys

import click

from air.aircli.client import entry


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-A", "--accounts", help="only these accounts (comma-separated)")
@click.option("-u", "--users", help="only these users (comma-separated)")
@click.option("-l", "--long", "long_", is_flag=True, help="also NormUsage, the GPU quota and GPUs in use")
@click.option("-n", "--noheader", is_flag=True, help="no header line")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs")
@click.option("--config", hidden=True)
def command(accounts, users, long_, noheader, as_json, config):
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    req = pb.SharesRequest(accounts=[a for a in (accounts or "").split(",") if a],
                           users=[u for u in (users or "").split(",") if u])
    rows = Client(config).shares(req).rows
    if as_json:
        json.dump({"shares": [formats.share_json(r) for r in rows]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    lines = formats.table(formats.share_rows(rows, long_), header=not noheader, left=(0, 1))
    sys.stdout.write("\n".join(lines) + "\n" if lines else "")


main = entry(command, "airshare")

if __name__ == "__main__":
    main()
