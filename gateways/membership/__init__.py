"""Who takes part, sans-IO: from which iteration a peer joins, which model the job trains, and what this
gateway owes its site's trainer (the push/aggregate ledger)."""
