"""The catalog: what the config roots declare (the backends, probes, data sets, models, arms and studies there are,
the classes they name, each probe's report sections and summaries). It reads config files and names classes;
it never runs a job, a report or a model."""
