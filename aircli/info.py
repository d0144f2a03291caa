"""airinfo: partitions and nodes, as sinfo shows them."""
from __future__ import annotations

import json
import sys

import click

from air.aircli.client import entry


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-N", "--Node", "per_node", is_flag=True, help="one line per node")
@click.option("-h", "--noheader", is_flag=True, help="no header line")
@click.option("-o", "--format", "fmt", help="sinfo-style %-field format")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs")
@click.option("-p", "--partition", "partitions", help="only these partitions (comma-separated)")
@click.option("--noconvert", is_flag=True, help="accepted: memory is shown in megabytes already")
@click.option("--config", hidden=True)
def command(per_node, noheader, fmt, as_json, partitions, noconvert, config):
    from air.aircli import formats
    from air.protos import squeue
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    default = formats.SINFO_NODE_DEFAULT if per_node else formats.SINFO_DEFAULT
    try:
        items = squeue.compile_format(fmt or default, formats.node_fields())
    except squeue.FormatError as e:
        raise click.BadParameter(str(e), param_hint="'-o'") from None
    reply = Client(config).list_nodes(pb.ListNodesRequest())
    if partitions:
        wanted = {p for p in partitions.split(",") if p}
        unknown = wanted - {p.name for p in reply.partitions}
        if unknown:
            raise click.BadParameter(f"no partition {', '.join(sorted(unknown))}", param_hint="'-p'")
        kept = [p for p in reply.partitions if p.name in wanted]
        names = {n for p in kept for n in p.nodes}
        nodes = [n for n in reply.nodes if n.name in names]
        for n in nodes:   # a node in several partitions shows under those asked for only
            kept_parts = [x for x in n.partitions if x in wanted]
            del n.partitions[:]
            n.partitions.extend(kept_parts)
        del reply.partitions[:]
        reply.partitions.extend(kept)
        del reply.nodes[:]
        reply.nodes.extend(nodes)
    if as_json:
        nodes = [{"name": n.name, "address": n.address, "state": formats.node_state(n),
                  "reason": n.reason, "cpus": n.cpus, "cpus_alloc": n.cpus_alloc, "memory_mb": n.memory_mb,
                  "gpus": len(n.gpus), "gpus_alloc": n.gpus_alloc, "partitions": list(n.partitions)}
                 for n in reply.nodes]
        parts = [{"name": p.name, "nodes": list(p.nodes), "default": p.default, "up": p.up,
                  "max_time_s": p.max_time_s} for p in reply.partitions]
        json.dump({"partitions": parts, "nodes": nodes}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for line in squeue.render(items, formats.node_groups(reply, per_node), header=not noheader):
        click.echo(line)


main = entry(command, "airinfo")

if __name__ == "__main__":
    main()
