"""The audit job: its config read once (`config.read_job`) and checked before anything loads, its model run behind
the store, its run logged (`run`); a sweep checked whole before its parent opens (`preflight`) and its jobs run
(`sweep`); `dry_run=true`. It wires the layers below together and
never holds a probe's, backend's or data set's own logic or names one.
"""
