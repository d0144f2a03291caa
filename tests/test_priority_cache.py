"""The priority cache against the from-scratch computation (PriorityModel.priorities and the sort of
scheduler.pass_order, what every pass used before the cache): over random sequences of passes (time
going on, now and then back; the fairshare of leaves moving a little or a lot; jobs coming, going,
and replaced by records that differ only in their priority or reason, or with a new request; the
cluster's size and the weights changing), every pass's priorities and the order it looks at jobs in
are the same, so no decision of the scheduler changes. Hypothesis also looks for sums that fall on
or next to .5, where rounding is decided.

The example count is 300 by default; AIR_CACHE_EXAMPLES=3000 runs more."""
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from air.airctld import priority_cache, scheduler
from air.protos.config import PartitionConfig, QosConfig, SchedulerConfig
from air.airctld.model import Job, evolve
from air.airctld.priority import PriorityModel
from air.airctld.priority_cache import LEAF, PriorityCache
from air.protos import air_pb2 as pb
from air.protos.states import Reason

EXAMPLES = int(os.environ.get("AIR_CACHE_EXAMPLES", "300"))
PARTS = {"a": PartitionConfig("a", ("n1",), priority=3), "b": PartitionConfig("b", ("n1",), priority=2)}
QOS = {"normal": QosConfig("normal"), "high": QosConfig("high", priority=4)}
LEAVES = [("ml", "alice"), ("ml", "bob"), ("bio", "carol"), ("default", "dan")]
EPOCH = 1.7e9   # times near the real clock's: the coarsest floats the controller sees

weights = st.integers(0, 3) | st.sampled_from([10, 1000, 2000, 10000, 10**6, 3 * 10**9])
times = st.floats(-5000, 5000, allow_nan=False) | st.sampled_from([0.0, 0.5, 1.5, 604800.0, 3600.0])


@st.composite
def jobs(draw, job_id):
    account, user = draw(st.sampled_from(LEAVES))
    gpus = draw(st.integers(0, 8))
    return Job(job_id=job_id, uid=1, gid=1, user=user, name="j", partition=draw(st.sampled_from(["a", "b", "x"])),
               num_nodes=draw(st.integers(1, 4)), gpus_per_node=gpus, cpus_per_node=draw(st.integers(1, 64)),
               time_limit_s=60, submit_time=EPOCH + draw(times),
               request=pb.JobRequest(account="" if account == "default" else account,
                                     qos=draw(st.sampled_from(["", "normal", "high", "none"])),
                                     nice=draw(st.integers(-3, 3) | st.sampled_from([0, 5000, -10000]))))


@st.composite
def fairshares(draw):
    return {leaf: draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0, 1)) for leaf in LEAVES
            if draw(st.booleans())}


@st.composite
def scenarios(draw):
    sched = SchedulerConfig(weight_age=draw(weights), weight_fairshare=draw(weights), weight_jobsize=draw(weights),
                            weight_partition=draw(weights), weight_qos=draw(weights),
                            max_age_s=draw(st.sampled_from([1, 60, 3600, 7 * 86400])))
    first = draw(st.lists(jobs(0), min_size=1, max_size=12))
    passes = []
    for _ in range(draw(st.integers(1, 8))):
        passes.append(dict(
            step=draw(st.sampled_from([0.0, 0.001, 1.0, 10.0, 3600.0, 1e6, -5.0]) | st.floats(0, 1e5)),
            fairshare=draw(st.one_of(st.just(None), fairshares())),
            nudge=draw(st.sampled_from([0.0, 1e-12, 1e-6, -1e-6, 0.01])),
            add=draw(st.lists(jobs(0), max_size=3)), remove=draw(st.integers(0, 2)),
            replace=draw(st.integers(0, 3)), renice=draw(st.integers(0, 2)), capacity=draw(st.sampled_from([(16, 64), (16, 64), (8, 640)])),
            sched=draw(st.sampled_from([None, None, None, "age"])), pending=draw(st.randoms(use_true_random=False))))
    return sched, first, passes


def _check(scenario):
    sched, first, passes = scenario
    cache = PriorityCache()
    jobs = [evolve(j, job_id=i + 1) for i, j in enumerate(first)]
    next_id = len(jobs) + 1
    now = EPOCH
    fs = {}
    for p in passes:
        now += p["step"]
        if p["fairshare"] is not None:
            fs = p["fairshare"]
        fs = {k: min(1.0, max(0.0, v + p["nudge"])) for k, v in fs.items()}
        jobs = jobs[p["remove"]:]
        for j in p["add"]:
            jobs.append(evolve(j, job_id=next_id))
            next_id += 1
        for k in range(min(p["replace"], len(jobs))):   # a new record, the same request: a pass's priority
            jobs[k] = evolve(jobs[k], priority=jobs[k].priority + 1, reason=Reason.PRIORITY)
        for k in range(min(p["renice"], len(jobs))):    # a new request: worked out again
            req = pb.JobRequest()
            req.CopyFrom(jobs[-1 - k].request)
            req.nice += 1
            jobs[-1 - k] = evolve(jobs[-1 - k], request=req)
        if p["sched"] == "age":
            sched = SchedulerConfig(**{**sched.__dict__, "weight_age": sched.weight_age + 7})
        model = PriorityModel(sched, PARTS, QOS, fs, *p["capacity"])
        pending = [j for j in jobs if p["pending"].random() < 0.7]   # the first rows; the order is theirs
        priced = pending + [j for j in jobs if j not in pending]
        rows = cache.rows(priced, PriorityModel(sched, PARTS, QOS, {}, *p["capacity"]))
        assert [r[LEAF] for r in rows] == [((j.request.account or "default"), j.user) for j in priced]
        expected = model.priorities(priced, now)
        assert cache.priorities(rows, fs, now) == expected
        assert cache.order(pending) == scheduler.pass_order(pending, expected)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_cache_gives_every_pass_the_priorities_and_the_order_computed_from_scratch(scenario):
    _check(scenario)


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_order_is_the_same_when_the_places_in_submit_order_run_out(scenario):
    real = priority_cache.SPAN
    priority_cache.SPAN = 8   # renumbered often, and sorted by tuples when there are more jobs than that
    try:
        _check(scenario)
    finally:
        priority_cache.SPAN = real


def test_a_sum_that_reaches_a_rounding_step_between_passes_is_worked_out_again():
    # one job whose sum passes 0.5 after a pass: age alone moves it, by a step below the margin's scale
    sched = SchedulerConfig(weight_age=1, weight_fairshare=0, weight_jobsize=0, weight_partition=0,
                            weight_qos=0, max_age_s=1000)
    job = Job(job_id=1, uid=1, gid=1, user="u", name="j", partition="a", num_nodes=1, gpus_per_node=0,
              cpus_per_node=1, time_limit_s=0, submit_time=EPOCH, request=pb.JobRequest())
    cache = PriorityCache()
    model = PriorityModel(sched, PARTS, QOS, {}, 16, 64)
    for now in (EPOCH + 499.9999, EPOCH + 500.0, EPOCH + 500.0001, EPOCH + 1499.0, EPOCH + 1500.0, EPOCH + 10.0):
        assert cache.priorities(cache.rows([job], model), {}, now) == model.priorities([job], now)


def test_a_pass_with_no_jobs_after_one_with_many_empties_the_cache():
    model = PriorityModel(SchedulerConfig(), PARTS, QOS, {}, 16, 64)
    cache = PriorityCache()
    jobs = [Job(job_id=i, uid=1, gid=1, user="u", name="j", partition="a", num_nodes=1, gpus_per_node=1,
                cpus_per_node=1, time_limit_s=0, submit_time=EPOCH - i, request=pb.JobRequest()) for i in range(1, 2000)]
    cache.rows(jobs, model)            # made, but no pass priced them
    for now in (EPOCH, EPOCH + 1):
        assert cache.priorities(cache.rows([], model), {}, now) == {} and cache.order([]) == []
    rows = cache.rows(jobs[:3], model)
    assert cache.priorities(rows, {}, EPOCH + 2) == model.priorities(jobs[:3], EPOCH + 2)
    assert cache.order(jobs[:3]) == scheduler.pass_order(jobs[:3], model.priorities(jobs[:3], EPOCH + 2))


def test_two_simulated_days_decide_alike_with_the_cache_and_from_scratch():
    """The simulator prices with the cache for a scheduler that takes in_order (this one), and from
    scratch for one that does not (an older one): every pass's plan is the same either way."""
    from air.airctld.simulate import make_nodes, simulate
    from test_scheduler_week import DAY, QOS, _trace

    def run(with_cache: bool):
        plans = []

        def cached(pending, free, partitions, *, holds=None, in_order=False, **kw):
            plans.append(scheduler.schedule(pending, free, partitions, holds=holds, in_order=in_order, **kw))
            return plans[-1]

        def scratch(pending, free, partitions, *, holds=None, **kw):
            plans.append(scheduler.schedule(pending, free, partitions, holds=holds, **kw))
            return plans[-1]
        sched = SchedulerConfig(preempt_grace_s=120.0, weight_age=50000, max_age_s=86400)   # ages that count
        r = simulate(_trace(2, 8, seed=11, high_share=0.2), make_nodes(8), until=2 * DAY, qos=QOS,
                     pass_every=300.0, sched=sched, schedule=cached if with_cache else scratch)
        return r, [(p.starts, p.preempt, p.waiting, p.reservations) for p in plans]

    (cached, plans), (scratch, expected) = run(True), run(False)
    assert plans == expected and cached.preemptions == scratch.preemptions and cached.started == scratch.started
    assert cached.started > 50 and cached.preemptions
