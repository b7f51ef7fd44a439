"""The retry schedule and the failure decision (retry.py): pure values, the schedule docs/webhooks.md promises."""

import pytest

from partner.retry import Decision, RetryPolicy, max_attempts, next_attempt_at

SECOND = 1000  # the schedule works in milliseconds
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DEFAULT_DELAYS = [60, 300, 1800, 7200, 21600, 86400]  # PARTNER_DELIVERY_RETRY_DELAYS, in seconds
FINISHED_AT = 1_800_000_000_123  # when the failed attempt ended, Unix ms

# docs/webhooks.md's schedule: failed attempt -> wait before the next one.
SCHEDULE = [(1, 1 * MINUTE), (2, 5 * MINUTE), (3, 30 * MINUTE), (4, 2 * HOUR), (5, 6 * HOUR),
              (6, 24 * HOUR)]

def every_attempt(jitters: list[float]) -> list:
    """(attempt, jitter) for attempts 1-6."""
    return [pytest.param(attempt, jitter, id=f"attempt{attempt}-jitter{jitter}")
            for attempt in range(1, 7) for jitter in jitters]


def wait_after(attempt: int, jitter: float = 0.0, finished_at: int = FINISHED_AT) -> int | None:
    next_at = next_attempt_at(attempt, finished_at, DEFAULT_DELAYS, jitter)
    return None if next_at is None else next_at - finished_at


def table_wait(attempt: int) -> int:
    return dict(SCHEDULE)[attempt]


# --- the table --------------------------------------------------------------------------------

def test_seven_attempts_per_event():
    assert max_attempts(DEFAULT_DELAYS) == 7


@pytest.mark.parametrize("attempt, wait", SCHEDULE)
def test_without_jitter_the_wait_is_exactly_the_table(attempt, wait):
    assert wait_after(attempt) == wait


def test_the_seventh_failed_attempt_is_dead_lettered():
    assert next_attempt_at(7, FINISHED_AT, DEFAULT_DELAYS) is None


@pytest.mark.parametrize("attempt", [8, 9, 100])
def test_no_attempt_after_the_seventh(attempt):
    assert next_attempt_at(attempt, FINISHED_AT, DEFAULT_DELAYS, 0.05) is None


@pytest.mark.parametrize("finished_at", [0, 1, 1_800_000_000_000, 1_800_000_000_999])
@pytest.mark.parametrize("attempt, wait", SCHEDULE)
def test_the_wait_counts_from_the_end_of_the_failed_attempt(attempt, wait, finished_at):
    assert next_attempt_at(attempt, finished_at, DEFAULT_DELAYS) == finished_at + wait


def test_the_whole_schedule_spans_the_table_sum():
    elapsed, attempt, finished_at = 0, 1, FINISHED_AT
    while (next_at := next_attempt_at(attempt, finished_at, DEFAULT_DELAYS)) is not None:
        elapsed, attempt, finished_at = elapsed + next_at - finished_at, attempt + 1, next_at
    assert (attempt, elapsed) == (7, (1 + 5 + 30) * MINUTE + (2 + 6 + 24) * HOUR)


# --- jitter -----------------------------------------------------------------------------------

@pytest.mark.parametrize("attempt, jitter", every_attempt([0.0, 0.01, 0.05, 0.0999, 0.1]))
def test_jitter_never_shortens_the_wait(attempt, jitter):
    assert wait_after(attempt, jitter) >= table_wait(attempt)


@pytest.mark.parametrize("attempt, jitter", every_attempt([0.01, 0.05, 0.0999]))
def test_jitter_below_ten_percent_stays_below_ten_percent(attempt, jitter):
    assert wait_after(attempt, jitter) <= table_wait(attempt) * 11 // 10


@pytest.mark.parametrize("attempt, jitter", every_attempt([0.1]))
def test_ten_percent_jitter_adds_at_most_ten_percent(attempt, jitter):
    assert wait_after(attempt, jitter) <= table_wait(attempt) * 11 // 10


@pytest.mark.parametrize("attempt, jitter", every_attempt([-0.01, -0.5, -1.0, -100.0]))
def test_negative_jitter_is_clamped_to_the_table(attempt, jitter):
    assert wait_after(attempt, jitter) == table_wait(attempt)


@pytest.mark.parametrize("attempt, jitter", every_attempt([0.11, 0.5, 1.0, 100.0]))
def test_jitter_above_ten_percent_is_clamped_to_ten_percent(attempt, jitter):
    wait = wait_after(attempt, jitter)
    assert table_wait(attempt) <= wait <= table_wait(attempt) * 11 // 10


@pytest.mark.parametrize("jitter", [0.11, 0.5, 1.0, 100.0])
def test_jitter_above_the_maximum_behaves_as_the_maximum(jitter):
    assert [wait_after(attempt, jitter) for attempt in range(1, 8)] == \
        [wait_after(attempt, 0.1) for attempt in range(1, 8)]


@pytest.mark.parametrize("jitter", [-1.0, 0.0, 0.05, 0.1, 5.0])
def test_jitter_does_not_change_the_dead_letter(jitter):
    assert wait_after(7, jitter) is None


# --- other schedules --------------------------------------------------------------------------

@pytest.mark.parametrize("delays, attempts", [
    ([], 1), ([0], 2), ([1, 1, 1], 4), ([60, 300], 3), (DEFAULT_DELAYS, 7), ([1] * 20, 21)])
def test_attempts_are_one_more_than_the_delays(delays, attempts):
    assert max_attempts(delays) == attempts


@pytest.mark.parametrize("delays, schedule", [
    ([1, 1, 1], [1000, 1000, 1000, None]),
    ([0], [0, None]),
    ([], [None]),
    ([2.5, 0.001], [2500, 1, None]),
    ([10, 20, 30], [10_000, 20_000, 30_000, None]),
])
def test_custom_delays_give_their_own_schedule(delays, schedule):
    waits = [next_attempt_at(attempt, FINISHED_AT, delays) for attempt in range(1, len(schedule) + 1)]
    assert [None if at is None else at - FINISHED_AT for at in waits] == schedule


@pytest.mark.parametrize("jitter", [0.0, 0.1, 1.0])
def test_custom_delays_jitter_stays_in_bounds(jitter):
    wait = next_attempt_at(1, FINISHED_AT, [10], jitter) - FINISHED_AT
    assert 10_000 <= wait <= 11_000


# --- the failure decision ---------------------------------------------------------------------

@pytest.mark.parametrize("consecutive_failures, disabled", [
    (1, False), (19, False), (20, True), (21, True), (1000, True)])
def test_auto_disable_at_twenty_consecutive_failures(consecutive_failures, disabled):
    decision = RetryPolicy(DEFAULT_DELAYS, 20).after_failure(1, consecutive_failures, True, FINISHED_AT, 0)
    expected_next = None if disabled else FINISHED_AT + MINUTE
    assert decision == Decision(expected_next, disabled)


@pytest.mark.parametrize("threshold, consecutive_failures, disabled", [
    (1, 1, True), (3, 2, False), (3, 3, True)])
def test_auto_disable_follows_the_configured_threshold(threshold, consecutive_failures, disabled):
    decision = RetryPolicy(DEFAULT_DELAYS, threshold).after_failure(2, consecutive_failures, True, FINISHED_AT, 0)
    assert decision.auto_disable is disabled


def test_the_decision_follows_the_schedule_with_its_jitter():
    decision = RetryPolicy(DEFAULT_DELAYS, 20).after_failure(3, 3, True, FINISHED_AT, 0.05)
    assert decision == Decision(next_attempt_at(3, FINISHED_AT, DEFAULT_DELAYS, 0.05), False)


def test_the_last_attempt_is_dead_lettered_without_disabling():
    assert RetryPolicy(DEFAULT_DELAYS, 20).after_failure(7, 7, True, FINISHED_AT, 0) == Decision(None, False)


def test_a_disabled_subscription_is_never_retried_nor_disabled_again():
    assert RetryPolicy(DEFAULT_DELAYS, 20).after_failure(1, 25, False, FINISHED_AT, 0) == Decision(None, False)
