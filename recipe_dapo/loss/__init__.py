"""The policy loss: ``dapo`` in verl's policy-loss registry (``dapo``) and the clip bounds it reads (``clip``).

``clip`` is pure (the start-up rules read it without importing verl); ``dapo`` imports verl's ``core_algos``,
and the plugin imports it only when verl imports its registry.
"""
