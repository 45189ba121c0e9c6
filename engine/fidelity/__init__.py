"""Provider fidelity: does a provider's completion come from the target model's own distribution?

Pure statistics (no I/O): the target's sampling distribution at a record's temperature and top_p
(:mod:`.dist`), per-record scores from the target's logits (:mod:`.score`), and the per-provider
verdict (:mod:`.verdict`). docs/fidelity.md states what is measured and how the thresholds were chosen.
"""
