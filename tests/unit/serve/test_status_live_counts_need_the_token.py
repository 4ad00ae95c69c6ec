"""Issue 38, found trying the surface again: the public /status showed live counts (requests
in flight and queued, the estimator's samples, batches sent, the canary's requests), so a
client polling it read when requests came, as from the arrival log the admin token protects.
Without the token (on a pod that has one) /status now shows the configuration (model, plan,
instances, readiness) and the batch-size estimate only; the operator sends the token."""

from __future__ import annotations

from dispatcher_support import all_up, post, run, stack

TOKEN = "t" * 24
LIVE = ("outstanding", "canary")


def test_live_counts_need_the_token() -> None:
    async def main() -> None:
        async with stack([2], admin_token=TOKEN) as (d, _, front, session):
            all_up(d)
            assert (await post(session, front))[0] == 200
            async with session.get(f"{front}/status") as r:
                public = await r.json()
            assert public["ready"] is True and public["batch_size_estimate"]["estimate"] >= 1
            assert not set(LIVE) & set(public), public
            assert set(public["batch_size_estimate"]) == {"estimate"}
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with session.get(f"{front}/status", headers=auth) as r:
                full = await r.json()
            assert set(LIVE) <= set(full) and "batches" in full["batch_size_estimate"]
        async with (
            stack([1]) as (d, _, front, session),  # a pod without a token: all public
            session.get(f"{front}/status") as r,
        ):
            assert set(LIVE) <= set(await r.json())

    run(main)
