"""The metric definitions (evaluation/metrics.py) on hand-built alarm sets."""
import pytest

from evaluation.metrics import (
    AlarmPoint,
    Outcome,
    cell_outcome,
    detected_beyond_clean,
    judge_run,
    wilson_interval,
)


def test_alarm_at_or_after_trigger_detects_with_latency():
    verdict = judge_run("buggy", trigger_step=5, trigger_time=100.0,
                        alarms=[AlarmPoint(7, 103.5), AlarmPoint(9, 104.0)])
    assert verdict.detected
    assert verdict.latency_steps == 2
    assert verdict.latency_seconds == pytest.approx(3.5)
    assert verdict.false_alarms == 0


def test_alarm_exactly_at_trigger_has_zero_latency():
    verdict = judge_run("buggy", trigger_step=5, trigger_time=100.0, alarms=[AlarmPoint(5, 100.2)])
    assert verdict.detected and verdict.latency_steps == 0


def test_pre_trigger_alarm_is_a_false_alarm_not_a_detection():
    verdict = judge_run("buggy", trigger_step=5, trigger_time=100.0, alarms=[AlarmPoint(4, 99.0)])
    assert not verdict.detected
    assert verdict.false_alarms == 1
    assert verdict.latency_steps is None


def test_pre_trigger_alarm_does_not_hide_a_later_detection():
    verdict = judge_run("buggy", trigger_step=5, trigger_time=100.0,
                        alarms=[AlarmPoint(2, 98.0), AlarmPoint(8, 101.0)])
    assert verdict.detected and verdict.false_alarms == 1 and verdict.latency_steps == 3


def test_first_qualifying_alarm_is_used_whatever_the_order():
    verdict = judge_run("buggy", trigger_step=0, trigger_time=0.0,
                        alarms=[AlarmPoint(6, 6.0), AlarmPoint(3, 3.0)])
    assert verdict.latency_steps == 3


def test_every_alarm_on_a_clean_run_is_false():
    verdict = judge_run("fixed", trigger_step=0, trigger_time=0.0, alarms=[AlarmPoint(3), AlarmPoint(10)])
    assert not verdict.detected and verdict.false_alarms == 2


def test_no_alarm_is_a_miss():
    verdict = judge_run("buggy", trigger_step=1, trigger_time=1.0, alarms=[])
    assert not verdict.detected and verdict.false_alarms == 0


def test_latency_seconds_unknown_without_times():
    verdict = judge_run("buggy", trigger_step=1, trigger_time=None, alarms=[AlarmPoint(1, None)])
    assert verdict.detected and verdict.latency_seconds is None


@pytest.mark.parametrize("successes, trials, low, high", [
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (1, 3, 0.0615, 0.7923),
    (5, 100, 0.0215, 0.1118),
])
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    got_low, got_high = wilson_interval(successes, trials)
    assert got_low == pytest.approx(low, abs=1e-4)
    assert got_high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_without_trials_is_uninformative():
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("buggy, detected, false_alarms, expected", [
    (3, 3, 0, Outcome.DETECTED),
    (3, 1, 2, Outcome.DETECTED),
    (3, 0, 1, Outcome.FALSE_ALARM),
    (3, 0, 0, Outcome.MISSED),
    (0, 0, 0, Outcome.NO_DATA),
])
def test_cell_outcome(buggy, detected, false_alarms, expected):
    assert cell_outcome(buggy, detected, false_alarms) == expected


def test_detection_beyond_the_fixed_twin_needs_a_rule_the_fixed_run_did_not_raise():
    alarms = [AlarmPoint(1, rule="setup noise"), AlarmPoint(4, rule="Adam.step() always calls adam.adam()")]
    assert detected_beyond_clean(3, alarms, clean_rules={"setup noise"})
    assert not detected_beyond_clean(3, alarms, clean_rules={"setup noise", "Adam.step() always calls adam.adam()"})
    assert not detected_beyond_clean(5, alarms, clean_rules=set())  # nothing at or after the trigger
