"""Every tag name fairaudit writes on an MLflow run, in one place: runs are found, compared and resumed by them,
so a rename is a breaking change (add a name, never rename one)."""

# a job's grid axes, tagged on its run under these names (and logged as short params, so Compare can plot them)
AXIS_TAGS = ("model", "dataset", "probe", "arm", "seed", "checkpoint")
ENGINE_TAG = "engine"                      # the backend and its numerics (e.g. "hf float32"), set once it is built
BACKEND_TAG = "backend"
SLURM_JOB_TAG = "slurm_job_id"             # the SLURM job that ran it (names its log folder)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # an experiment's, set to MODEL_TRAINING_KIND (MLflow's UI view)
MODEL_TRAINING_KIND = "custom_model_development"

KIND_TAG = "fairaudit.kind"                # job | sweep | report
VERSION_TAG = "fairaudit.version"
KEY_TAG = "fairaudit.key"                  # hash of a job's resolved config and overrides (a sweep's: its overrides)
JOB_NUM_TAG = "fairaudit.job_num"          # a sweep job's number
JOB_OVERRIDES_TAG = "fairaudit.job_overrides"  # a sweep job's overrides
HEADLINE_TAG = "fairaudit.headline"        # a job's headline metric names (JSON list), set by the job
ERROR_TAG = "fairaudit.error"              # a failed run's error line
SUPERSEDED_TAG = "fairaudit.superseded_by"  # a later run of the same job that replaces this one
RESUMES_TAG = "fairaudit.resumes"          # runs of the same job this run closed as KILLED
UNBOUNDED_TAG = "fairaudit.unbounded_metrics"  # infinite metrics (an interval unbounded above): MLflow skips them
WARNINGS_TAG = "fairaudit.warnings"        # a job's verdict warnings, one per line (warnings.txt holds them too)
UNDEFINED_TAG = "fairaudit.undefined"      # why each of a job's n/a metrics is undefined (JSON: reason -> metrics)
PROCESS_TAGS = ("fairaudit.host", "fairaudit.pid", "fairaudit.pid_start")  # the process that owns a RUNNING run

SWEEP_DIR_TAG = "fairaudit.sweep_dir"      # a sweep parent's Hydra folder
OVERRIDES_TAG = "fairaudit.overrides"      # a sweep parent's command-line overrides (JSON list)
STUDY_TAG = "fairaudit.study"              # a sweep's overrides but the probe's: one grid's sweeps under several probes
PROBE_TAG = "fairaudit.probe"              # the probe(s) a sweep runs, e.g. "cdpg" or "counterfactual,btm"
FAILED_JOBS_TAG = "fairaudit.failed_jobs"  # a sweep parent's summary of the jobs that did not finish
JOBS_TAG = "fairaudit.jobs"                # a sweep's jobs, each named by what it varies (JSON list, by job number)
COMMAND_TAG = "fairaudit.command"          # the command that started a sweep (and resumes it)

SELECTION_TAG = "fairaudit.selection"      # a report run's filter string
N_SOURCE_RUNS_TAG = "fairaudit.n_source_runs"
SOURCE_RUNS_TAG = "fairaudit.source_runs"  # the runs a report read
SOURCE_PARENT_TAG = "fairaudit.source_parent"
SOURCE_PARENTS_TAG = "fairaudit.source_parents"

NOTE_TAG = "mlflow.note.content"           # the run's description in the MLflow UI
PARENT_TAG = "mlflow.parentRunId"          # MLflow's own link from a child run to its sweep's parent
MAX_TAG = 8000                             # characters MLflow keeps in a tag's value

PARENT_ID_FILE = "mlflow_parent_run_id"    # in a sweep's Hydra folder: its parent run, for its jobs to find
