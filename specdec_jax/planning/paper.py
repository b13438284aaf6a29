"""The paper's published numbers (Leviathan et al. 2023), for side-by-side
tables. Keys: (task, draft, temperature)."""

# Table 2: T5-XXL target; (gamma, alpha, walltime speedup).
TABLE2 = {
    ("ende", "t5_small", 0): (7, 0.75, 3.4),
    ("ende", "t5_base", 0): (7, 0.80, 2.8),
    ("ende", "t5_large", 0): (7, 0.82, 1.7),
    ("ende", "t5_small", 1): (7, 0.62, 2.6),
    ("ende", "t5_base", 1): (5, 0.68, 2.4),
    ("ende", "t5_large", 1): (3, 0.71, 1.4),
    ("cnndm", "t5_small", 0): (5, 0.65, 3.1),
    ("cnndm", "t5_base", 0): (5, 0.73, 3.0),
    ("cnndm", "t5_large", 0): (3, 0.74, 2.2),
    ("cnndm", "t5_small", 1): (5, 0.53, 2.3),
    ("cnndm", "t5_base", 1): (3, 0.55, 2.2),
    ("cnndm", "t5_large", 1): (3, 0.56, 1.7),
}

# Table 4: measured c against T5-XXL.
COST = {"t5_small": 0.02, "t5_base": 0.04, "t5_large": 0.11}

# Table 3: alpha at temperature 0 and 1; keys (target, draft).
TABLE3 = {
    ("gpt_97m", "unigram"): (0.03, 0.03),
    ("gpt_97m", "bigram"): (0.05, 0.05),
    ("gpt_97m", "gpt_6m"): (0.88, 0.89),
    ("t5_xxl_ende", "unigram"): (0.08, 0.07),
    ("t5_xxl_ende", "bigram"): (0.20, 0.19),
    ("t5_xxl_ende", "t5_small"): (0.75, 0.62),
    ("t5_xxl_ende", "t5_base"): (0.80, 0.68),
    ("t5_xxl_ende", "t5_large"): (0.82, 0.71),
    ("lamda_137b", "lamda_100m"): (0.61, 0.57),
    ("lamda_137b", "lamda_2b"): (0.71, 0.71),
    ("lamda_137b", "lamda_8b"): (0.75, 0.74),
}
