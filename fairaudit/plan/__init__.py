"""`fairaudit plan`: what a run or a study would ask of a model, and whether its tests can show the effects named,
told before any weights load. Each job rehearsed against a counting client (`rehearsal`), the rates pilots timed
(`speeds`), the command's tables (`study`). It reads jobs as the run reads them; it never logs a run.
"""
