"""Runs SQL over vramshim's Parquet export with DuckDB and prints the answer as JSON.

    parquet_sql.py FILE.parquet peaks   # {"peaks": [[rank, device, peak], ...], ...}

`peaks` is the peak in use per trace and device in one statement: the running sum of `size`
(allocations add, frees subtract) over successful alloc/free rows, ordered by (t_ns, seq)
within each rank and device, and its maximum. Also reported: rows and distinct files per
rank, the schema, and sanity figures the test checks (frees whose size is unknown, seq gaps).
"""
import json
import sys

import duckdb

path = sys.argv[1]
mode = sys.argv[2]
con = duckdb.connect()
con.execute("SET threads TO 2")
src = f"read_parquet('{path}')"

if mode != "peaks":
    sys.exit(f"unknown mode {mode}")

peaks = con.execute(
    f"""
    WITH d AS (
        SELECT rank, device, t_ns, seq,
               CASE WHEN op = 'alloc' THEN size ELSE -size END AS delta
        FROM {src}
        WHERE op IN ('alloc', 'free') AND NOT failed
    ), r AS (
        SELECT rank, device,
               SUM(delta) OVER (PARTITION BY rank, device ORDER BY t_ns, seq
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS in_use
        FROM d
    )
    SELECT rank, device, CAST(MAX(in_use) AS BIGINT) FROM r GROUP BY rank, device
    ORDER BY rank, device
    """
).fetchall()

per_rank = con.execute(
    f"""
    SELECT rank, COUNT(*), COUNT(DISTINCT file), MIN(seq), MAX(seq),
           COUNT(*) FILTER (WHERE op = 'free' AND NOT failed AND addr <> 0 AND size = 0)
    FROM {src} GROUP BY rank ORDER BY rank
    """
).fetchall()

schema = con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()
sites = con.execute(
    f"SELECT DISTINCT site FROM {src} WHERE site IS NOT NULL ORDER BY site"
).fetchall()
ops = con.execute(f"SELECT op, COUNT(*) FROM {src} GROUP BY op ORDER BY op").fetchall()
refused = con.execute(
    f"SELECT COUNT(*) FROM {src} WHERE op = 'alloc' AND failed AND cap_refused"
).fetchone()[0]

print(
    json.dumps(
        {
            "peaks": [[int(a), int(b), int(c)] for a, b, c in peaks],
            "ranks": [
                {
                    "rank": int(r),
                    "rows": int(n),
                    "files": int(f),
                    "min_seq": int(lo),
                    "max_seq": int(hi),
                    "unmatched_frees": int(u),
                }
                for r, n, f, lo, hi, u in per_rank
            ],
            "columns": {name: typ for name, typ, *_ in schema},
            "sites": [s for (s,) in sites],
            "ops": {o: int(n) for o, n in ops},
            "cap_refused_allocs": int(refused),
        }
    )
)
