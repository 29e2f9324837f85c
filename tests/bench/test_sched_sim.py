"""The scheduling simulator's mechanics: without noise a lone client's latency is the sum of the modelled
path, a saturated device serves closed steps of the shared cap back to back, and a seed fixes a run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quiver.bench.sched_sim import Model, simulate

QUIET = dict(step_jitter=0.0, hop_tail_s=0.0, cpu_jitter=0.0)


def test_a_lone_client_waits_for_the_path_and_one_step() -> None:
    model = Model(**QUIET)
    outcome = simulate(model, clients=1, requests=20)
    path = (4 * model.hop_s + model.parse_s + model.tokenize_s + model.send_s + model.answer_s
            + model.launch_s + model.step_s + model.step_s_per_token * model.tokens)
    assert outcome.latencies_ms == pytest.approx([path * 1e3] * 15)
    assert set(outcome.step_sizes) == {1}


@pytest.mark.parametrize("shared", [2048, 4096])
def test_a_saturated_device_runs_closed_steps_of_the_shared_cap_back_to_back(shared: int) -> None:
    model = Model(**QUIET, shared_step_tokens=shared)
    clients = 64
    outcome = simulate(model, clients=clients, requests=30)
    per_step = shared // model.tokens
    step_s = model.step_s + model.step_s_per_token * shared
    assert max(outcome.step_sizes) == per_step
    # Little's law: each client waits for the steps of every client's request, one step of the cap at a time.
    assert sorted(outcome.latencies_ms)[len(outcome.latencies_ms) // 2] == pytest.approx(
        clients / per_step * step_s * 1e3, rel=0.02)


def test_without_queued_steps_a_step_is_launched_only_on_an_idle_device() -> None:
    queued = simulate(Model(**QUIET), clients=64, requests=10)
    unqueued = simulate(Model(**QUIET, queue_steps=False), clients=64, requests=10)
    assert sorted(queued.latencies_ms)[-1] < sorted(unqueued.latencies_ms)[-1]  # the host's turn costs the device time


def test_a_seed_fixes_the_run_and_another_seed_changes_it() -> None:
    first, again, other = (simulate(Model(), clients=8, requests=20, seed=seed) for seed in (1, 1, 2))
    assert first.latencies_ms == again.latencies_ms and first.latencies_ms != other.latencies_ms


def test_the_command_prints_a_row_per_policy() -> None:
    done = subprocess.run([sys.executable, "-m", "quiver.bench.sched_sim", "--clients", "1,8", "--requests", "20",
                           "--seeds", "1", "--queue-steps", "on,off"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 | 4096 |")]
    assert [row.split("|")[3].strip() for row in rows] == ["on", "off"], done.stdout
