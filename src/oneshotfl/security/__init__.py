"""Threat models and audits: simulated malicious clients (:mod:`~oneshotfl.security.threats`),
the model-inversion audit of uploaded embeddings (:mod:`~oneshotfl.security.inversion`) and the
membership-inference audit of uploads (:mod:`~oneshotfl.security.membership`)."""
