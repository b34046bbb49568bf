"""docs/resume.md: what a resume does with each setting it changes, from the one table the resume reads
(``gptmini.training.run.resume.RESUME_POLICY``): ``python scripts/resume_page.py > docs/resume.md``."""

from __future__ import annotations

from gptmini.training.run.resume import OBEY, REFUSALS, RESUME_POLICY, SAY

MEANING = {
    OBEY: ("obeyed", "it takes effect from the first resumed step"),
    SAY: (
        "obeyed and said",
        "it takes effect from the first resumed step, named in the resume's line of changes",
    ),
}


def resume_page() -> str:
    lines = [
        "# Resuming: what a changed setting does",
        "",
        "A resume (`ckpt_path=...`) compares every setting of the checkpoint's run record with this run's through",
        "one table, generated here from the code (`python scripts/resume_page.py > docs/resume.md`). A change is",
        "obeyed, obeyed and said (one log line lists them), or refused in one `error:` line before any work. `group.*`",
        "stands for the settings of a group not named apart. Another corpus with the same tokenizer is said once the",
        "data is prepared; another tokenization of it is refused.",
        "",
        "| setting | a change is | why |",
        "| --- | --- | --- |",
    ]
    for key, policy in RESUME_POLICY.items():
        if policy in REFUSALS:
            what, why, _ = REFUSALS[policy]
            lines.append(f"| `{key}` | refused (another {what}) | {why} |")
        else:
            lines.append(f"| `{key}` | {MEANING[policy][0]} | {MEANING[policy][1]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(resume_page(), end="")
