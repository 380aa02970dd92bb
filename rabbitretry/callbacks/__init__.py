"""Third-party callbacks: a durable receiver and a guarded state machine.

A gateway that calls you back retries while it gets errors, then gives up for good, and its
callbacks come duplicated, out of order, and late. So the receiver only stores: each callback
is verified (:class:`HmacSignature`), keyed by its business id (:class:`CallbackKind`), and
written through the outbox before the 200 (:class:`CallbackReceiver`); a consumer handles it
from its queue. The record it changes moves only along declared transitions
(:class:`StateMachine`), so a late duplicate cannot move it back.
"""

from rabbitretry.callbacks.kinds import CallbackKind
from rabbitretry.callbacks.receiver import CallbackReceiver
from rabbitretry.callbacks.signatures import HmacSignature, sign
from rabbitretry.callbacks.states import Change, RecordNotFound, StateMachine

__all__ = [
    "CallbackKind",
    "CallbackReceiver",
    "Change",
    "HmacSignature",
    "RecordNotFound",
    "StateMachine",
    "sign",
]
