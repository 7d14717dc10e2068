"""A user's batch job on a Spark cluster of its own: `local-cluster[2,1,1024]`, two workers
whose executors are separate JVMs with their own Python workers. Run as a plain
`python -m tests.support.spark_cluster_job BOOTSTRAP TOPIC ROWS [ARCHIVE]`, as a user
would run a script; the environment says which Python the executors run (PYSPARK_PYTHON)
and where Spark keeps the workers' directories (SPARK_HOME). With ARCHIVE (a tar.gz holding
the aioproducer package), the package is shipped with `spark.archives` and put on the
executors' path. Prints one JSON line: where each task imported aioproducer from, and in
which process.
"""

import json
import os
import sys

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import register


def main(bootstrap: str, topic: str, rows: str, archive: str | None = None) -> None:
    builder = (SparkSession.builder.master("local-cluster[2,1,1024]")
               .appName("aioproducer-cluster").config("spark.ui.enabled", "false"))
    if archive:
        builder = (builder.config("spark.archives", f"{archive}#shipped")
                   .config("spark.executorEnv.PYTHONPATH", "shipped"))
    spark = builder.getOrCreate()
    try:
        register(spark)

        def where(_: object) -> list[tuple[int, str]]:
            import aioproducer

            return [(os.getpid(), aioproducer.__file__)]

        tasks = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
        (spark.range(int(rows), numPartitions=4).selectExpr("CAST(id AS STRING) AS value")
         .write.format("aioproducer").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).mode("append").save())
        print(json.dumps({"driver": os.getpid(), "tasks": tasks}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
