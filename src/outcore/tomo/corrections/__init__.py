"""Corrections of the projections, applied lazily between the raw scan and the solver.

``correction`` (the contract: ``Correction``, ``Step``), ``steps`` (the steps in the order
they are applied, their options, configuration and memory), and one module per step:
``phase`` (Paganin phase retrieval), ``stitch`` (half-acquisition stitching) and ``rings``
(ring removal on sinograms re-sliced by ``reslice``).
"""
