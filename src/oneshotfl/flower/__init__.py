"""Running oneshotfl methods on Flower (the optional ``oneshotfl[flower]`` extra).

Every flwr import of oneshotfl lives in this package; nothing in ``methods/`` knows Flower.

* :mod:`~oneshotfl.flower.messages` — our wire bytes inside Flower records;
* :mod:`~oneshotfl.flower.node` — the client side on a node (its own shard only);
* :mod:`~oneshotfl.flower.server` — the server side over a Grid (dropouts, quorum, results);
* :mod:`~oneshotfl.flower.app` — the ServerApp and ClientApp;
* :mod:`~oneshotfl.flower.cli` — ``oneshotfl flower ...`` (app directory, certificates, keys).

Importing this package does not import flwr; its modules do.
"""
