"""What a stage leaves for its readers (its ledger, the run set its conclusions use, where each run stands): the
engine writes it; `plan`, the analysis and the dashboard read it without importing the engine."""
