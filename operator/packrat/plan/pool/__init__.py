"""Ignite's regime, pure: which layers of which models stay resident under a budget (LCache,
:mod:`.lcache`, shared by the CPU pool and the GPU tier) and which pool pod hosts each model
(:mod:`.placement`)."""
