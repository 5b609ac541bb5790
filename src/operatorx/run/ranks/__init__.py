"""Multi-rank cases: a case with `parallel` tp·dp = W > 1 run by W worker processes of one host as one
torch.distributed group (docs/scaling.md, "Cases split over several GPUs").

Parent side: `placement` (which cases need W workers, refusals, order), `gang` (W workers driven as
one case, their outcomes made one). Worker side: `group` (the process group), `rank_runner` (one
rank's part of the case, rank 0's row), `faults` (injected rank faults for the tests of the fault paths).
"""
