"""What a run shows and keeps: verl's ``Tracking`` with the recipe's backends (``tracker``), the console's step
lines and end-of-run summary (``console``), the noise kept off the console (``noise``) and the appending metrics
file (``run_log``).

Nothing is imported here: ``noise`` is installed before verl is imported, and ``tracker`` imports verl.
"""
