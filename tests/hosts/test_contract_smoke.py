"""A smoke subset of the runtime contract suite (tests/runtime), run on the host bed's deployment: the
same test functions, whose `backend`, `runtime` and `queue` are the bed's (tests/hosts/conftest.py)."""

from tests.runtime.test_mail_queue_contract import (
    test_dequeue_is_fifo,
    test_killed_consumer_mail_is_redelivered_after_the_visibility_timeout,
    test_out_of_order_acks,
    test_retry_redelivers,
    test_round_trip_is_the_same_mail_through_dequeue_and_browse,
    test_several_items_in_flight_at_once,
    test_twelve_mebibyte_mail,
)
from tests.runtime.test_manageable_contract import (
    test_a_mail_whose_content_is_lost_is_dead_lettered_not_retried,
    test_content_is_released_when_a_mail_leaves,
    test_reject_moves_the_mail_to_the_dead_letters,
    test_remove_deletes_every_match,
    test_size_after_done_retry_and_unsettled_dequeue,
)

__all__ = [
    "test_a_mail_whose_content_is_lost_is_dead_lettered_not_retried",
    "test_content_is_released_when_a_mail_leaves",
    "test_dequeue_is_fifo",
    "test_killed_consumer_mail_is_redelivered_after_the_visibility_timeout",
    "test_out_of_order_acks",
    "test_reject_moves_the_mail_to_the_dead_letters",
    "test_remove_deletes_every_match",
    "test_retry_redelivers",
    "test_round_trip_is_the_same_mail_through_dequeue_and_browse",
    "test_several_items_in_flight_at_once",
    "test_size_after_done_retry_and_unsettled_dequeue",
    "test_twelve_mebibyte_mail",
]
