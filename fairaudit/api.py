"""The public face for code outside fairaudit: what a probe, a backend or a report section of your own may import.

Import from here alone (`from fairaudit.api import Probe, ProbeResult, ...`); these names stay, with their
signatures, across minor versions. Every other module of fairaudit may move or change; docs/adding.md says how
each name is used.
"""

from fairaudit.backends import (
    Backend,
    Block,
    Capabilities,
    Completion,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
    refuse_graphs,
)
from fairaudit.backends.common import completion_from_ids, encode_texts, stop_token_ids
from fairaudit.errors import AuditError
from fairaudit.errors.rules import check_fields, integer, number, one_of, optional, text
from fairaudit.models.files import ModelFiles
from fairaudit.models.locate import model_fingerprint, resolve_model_dir
from fairaudit.probes import AuditContext, ModelSpec, Needs, PlannedTest, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.decisions import answer_choices, decide, encode_all, render_prompts
from fairaudit.probes.paired_samples import PAIRS
from fairaudit.prompts.yesno import Arm
from fairaudit.views.pages import Layout, esc, item, slug
from fairaudit.views.render import section
from fairaudit.views.sections import Report, Section
from fairaudit.views.selection import runs_of, shared, with_metric

__all__ = [
    # a probe
    "Probe", "Needs", "Prompt", "ProbeResult", "SampleView", "PlannedTest", "AuditContext", "ModelSpec", "Arm",
    "answer_choices", "decide", "encode_all", "render_prompts", "PAIRS", "Layout", "esc", "item", "slug",
    # a backend
    "Backend", "Capabilities", "Completion", "GenerationRequest", "DepthRequest", "Block", "GraphGenerationRequest",
    "NLLRequest", "refuse_graphs", "completion_from_ids", "encode_texts", "stop_token_ids", "model_fingerprint",
    "resolve_model_dir", "ModelFiles",
    # a report section
    "Report", "Section", "section", "shared", "runs_of", "with_metric",
    # settings and errors
    "AuditError", "check_fields", "integer", "number", "one_of", "optional", "text",
]
