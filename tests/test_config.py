"""Configuration: every bad key or value stops start-up with a message naming it."""
import pytest

from air.protos.config import ConfigError, load, parse

GOOD = {
    "controller": {"address": "127.0.0.1:6817", "node_timeout_s": 3, "heartbeat_interval_s": 0.5},
    "nodes": [{"name": "node[01-02]", "address": "127.0.0.[2-3]", "gpus": "sim:4"}],
    "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True, "max_time": "1-00:00:00"}],
}


def test_good_config_expands_host_lists():
    cfg = parse(GOOD)
    assert [(n.name, n.endpoint) for n in cfg.nodes] == [("node01", "127.0.0.2:6818"), ("node02", "127.0.0.3:6818")]
    assert cfg.partition("").name == "gpu" and cfg.partition("gpu").max_time_s == 86400
    assert cfg.partition("other") is None


def _with(section, change, index=None):
    data = {k: (list(v) if isinstance(v, list) else dict(v)) for k, v in GOOD.items()}
    if index is None:
        data[section] = {**data[section], **change}
    else:
        data[section][index] = {**data[section][index], **change}
    return data


@pytest.mark.parametrize("data,message", [
    (_with("controller", {"adress": "x"}), "unknown key 'adress' in [controller]"),
    (_with("controller", {"node_timeout_s": "3"}), "[controller] node_timeout_s = '3': expected a float"),
    (_with("controller", {"auth": "kerberos"}), "auth = 'kerberos': valid values are none"),
    (_with("controller", {"node_timeout_s": 0.1}), "node_timeout_s must be longer than heartbeat_interval_s"),
    (_with("nodes", {"gpus": "sim:x"}, 0), "gpus = 'sim:x'"),
    (_with("nodes", {"address": "127.0.0.[2-4]"}, 0), "2 names but 3 addresses"),
    (_with("nodes", {"colour": "red"}, 0), "unknown key 'colour' in [[nodes]] #1"),
    (_with("partitions", {"nodes": "node[01-03]"}, 0), "names node node03, which no [[nodes]] entry defines"),
    (_with("partitions", {"max_time": "forever"}, 0), "[[partitions]] #1 max_time: time 'forever'"),
    ({**GOOD, "extra": {}}, "unknown key 'extra' in the top level"),
    (_with("controller", {"jobs_keep_days": 0.001}), "jobs_keep_days = 0.001: at least min_job_age_s"),
    (_with("controller", {"events_keep_days": 0}), "events_keep_days = 0: must be above 0"),
    (_with("controller", {"max_pids_per_job": -1}), "max_pids_per_job = -1: must not be negative"),
    (_with("nodes", {"name": "a/b", "address": "127.0.0.2"}, 0), "name 'a/b' is not a node name"),
    (_with("nodes", {"name": "..", "address": "127.0.0.2"}, 0), "name '..' is not a node name"),
    (_with("controller", {"kill_wait_s": float("nan")}), "kill_wait_s = nan: must be a finite number"),
    (_with("controller", {"node_timeout_s": float("inf")}), "node_timeout_s = inf: must be a finite number"),
    (_with("controller", {"unkillable_timeout_s": 0.5}), "unkillable_timeout_s = 0.5: 0 (never), or at least 2"),
    (_with("controller", {"propagate_rlimits": ["ALL", "FILES"]}), "propagate_rlimits: 'FILES' is not a limit"),
    (_with("controller", {"kill_wait_s": 1e10}), "kill_wait_s = 10000000000.0: at most 1e+09"),
    (_with("controller", {"kill_wait_s": 10 ** 400}), "kill_wait_s = 10000000000000000000...: at most 1e+09"),
    (_with("controller", {"max_message_bytes": 2 ** 31}), "max_message_bytes = 2147483648: at most 2.14748e+09"),
    ({**GOOD, "scheduler": {"max_age": float("inf")}}, "[scheduler] max_age: time 'inf' is not one of"),
    (_with("partitions", {"max_time": 10 ** 12}, 0), "max_time = 1000000000000: at most 2147483647 s"),
    (_with("controller", {"metrics_address": "9817"}), "metrics_address = '9817': give host:port"),
    (_with("controller", {"address": "127.0.0.1:²"}), "address = '127.0.0.1:²': give host:port"),
    (_with("controller", {"address": "127.0.0.1:http"}), "address = '127.0.0.1:http': give host:port"),
    (_with("controller", {"address": ":6817"}), "address = ':6817': give host:port"),
    (_with("controller", {"address": "h:0"}), "address = 'h:0': give host:port"),
    (_with("controller", {"address": "h:65536"}), "address = 'h:65536': give host:port"),
    (_with("controller", {"address": "dns:///127.0.0.1:6817"}), "address = 'dns:///127.0.0.1:6817': give host:port"),
    (_with("controller", {"address": "h:٦٨١٧"}), "address = 'h:٦٨١٧': give host:port"),
    (_with("controller", {"address": "h:" + "1" * 5000}), "address = 'h:111"),
    (_with("controller", {"metrics_address": "h:٩٨١٧"}), "metrics_address = 'h:٩٨١٧': give host:port"),
    (_with("controller", {"metrics_address": "ipv4:1.2.3.4:9817"}), "metrics_address = 'ipv4:1.2.3.4:9817'"),
    (_with("nodes", {"name": "n1", "address": "127.0.0.2", "gpus": "sim:٣"}, 0), "gpus = 'sim:٣': valid values"),
    (_with("nodes", {"metrics_port": 70000}, 0), "metrics_port = 70000: not a port number"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError) as e:
        parse(data)
    assert message in str(e.value)


def test_load_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "air.toml"
    path.write_text("[controller]\nadress = 1\n")
    with pytest.raises(ConfigError, match=f"^{path}: unknown key 'adress'"):
        load(str(path))
    monkeypatch.setenv("AIR_CONF", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="missing.toml does not exist"):
        load()


def test_shipped_example_configuration_loads():
    from pathlib import Path
    cfg = load(str(Path(__file__).resolve().parent.parent / "etc" / "air.toml"))
    assert [n.name for n in cfg.nodes] == ["node01", "node02"] and cfg.partition("").max_time_s == 7 * 86400
    assert cfg.controller.auth == "munge" and [a.name for a in cfg.accounts] == ["ml-research", "vision"]


def test_who_may_use_a_qos():
    """A QOS is open to all unless it names users or accounts; one that preempts others must name
    them (or only operators may use it): else any user could take any other's running job."""
    import pwd
    from air.airctld.errors import Denied
    from air.airctld.policy import Policy
    from air.protos.credential import Identity
    cfg = parse({**GOOD, "accounts": [{"name": "ml"}, {"name": "bio"}],
                 "qos": [{"name": "normal"}, {"name": "team", "users": ["nobody"]},
                         {"name": "urgent", "preempt": ["normal"]},
                         {"name": "paid", "preempt": ["normal"], "accounts": ["ml"]}]})
    policy = Policy(cfg)
    nobody = pwd.getpwnam("nobody")
    user = Identity(uid=nobody.pw_uid, gid=nobody.pw_gid)
    root = Identity(uid=0, gid=0)
    allowed = {(q.name, account): True for q in cfg.qos for account in ("ml", "bio")}
    for (name, account) in list(allowed):
        try:
            policy.check_qos(user, cfg.qos_named(name), account)
        except Denied:
            allowed[(name, account)] = False
        policy.check_qos(root, cfg.qos_named(name), account)   # operators: always
    assert allowed == {("normal", "ml"): True, ("normal", "bio"): True, ("team", "ml"): True,
                       ("team", "bio"): True, ("urgent", "ml"): False, ("urgent", "bio"): False,
                       ("paid", "ml"): True, ("paid", "bio"): False}


def test_a_default_qos_that_preempts_stays_open_and_a_qos_names_only_real_accounts():
    import pwd
    from air.airctld.policy import Policy
    from air.protos.credential import Identity
    cfg = parse({**GOOD, "scheduler": {"default_qos": "normal"},
                 "qos": [{"name": "normal", "preempt": ["scavenger"]}, {"name": "scavenger"}]})
    nobody = pwd.getpwnam("nobody")
    Policy(cfg).check_qos(Identity(nobody.pw_uid, nobody.pw_gid), cfg.qos_named("normal"), "default")
    with pytest.raises(ConfigError, match="accounts names 'ml', which no"):
        parse({**GOOD, "qos": [{"name": "normal"}, {"name": "paid", "preempt": ["normal"], "accounts": ["ml"]}]})


@pytest.mark.parametrize("address, bare_ipv6, expected", [
    ("127.0.0.1:6817", False, ("127.0.0.1", 6817)), ("[::1]:6817", False, ("::1", 6817)),
    ("ipv4:6817", False, ("ipv4", 6817)),   # (a host named ipv4)
    ("localhost:6817", False, ("localhost", 6817)), ("0.0.0.0:9817", True, ("0.0.0.0", 9817)),
    ("[::]:9817", True, ("::", 9817)), ("::1:9817", True, ("::1", 9817)), (":::9817", True, ("::", 9817)),
    ("::1:6817", False, None), ("fe80::1", False, None), ("fe80::1", True, None), ("fe80::zz:1", True, None),
    ("dns:///head:6817", False, None), ("ipv4:10.0.0.1:6817", False, None), ("dns:///h:9817", True, None),
("a/b:80", False, None), ("h:0", False, None), ("h:65536", False, None),
    ("h:٦٨١٧", False, None), ("h:" + "1" * 5000, False, None), (":6817", False, None), ("6817", False, None),
])
def test_addresses_are_read_one_way(address, bare_ipv6, expected):
    """protos.hostport: the controller's address as the configuration checks it, airctld binds it and
    the tools call it, and the metrics address as airctld binds it (also an IPv6 address unbracketed,
    as it was always read)."""
    from air.protos import hostport, metrics_http
    if expected is None:
        with pytest.raises(ValueError):
            hostport.split(address, bare_ipv6)
        if bare_ipv6:
            with pytest.raises(ValueError):
                metrics_http.split_address(address)
    else:
        assert hostport.split(address, bare_ipv6) == expected
        if bare_ipv6:
            assert metrics_http.split_address(address) == expected
