# shellcheck shell=dash
# Shadow doorbells: the host reads the server's counters at the marks and
# computes trapped doorbell writes per I/O over each fio run (guest-tests.sh).
# 2 s of 4k randread on NSID 1: two jobs at QD 32 (one per vCPU, so two
# submission queues; checked by the host), then one job at QD 64, 16 and 1
# (reported). With --poll off the controller sleeps whenever it runs out of
# work and asks for the next doorbell through EventIdx, so the ratio is about
# one trap per sleep. Under TCG a single submitting vCPU is slower than the
# controller, which then sleeps after almost every batch: QD 64 with one job
# varied from 0.15 to 0.85 between runs, two jobs stayed at 0.15-0.20.
db_runs() { # PREFIX
    for spec in 2x32 1x64 1x16 1x1; do
        jobs=${spec%x*} qd=${spec#*x}
        sleep 1
        mark "$1-$spec-start" 0
        fio --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randread --bs=4k \
            --iodepth="$qd" --numjobs="$jobs" --runtime=2 --time_based --norandommap \
            --randrepeat=0 --group_reporting --name=db --eta=never >/tmp/o 2>&1 ||
            { t_fail "doorbell run $spec: fio"; tail -n 10 /tmp/o; }
        mark "$1-$spec-end"
        echo "doorbell run $jobs job(s) x QD$qd: $(grep -E '^ +read:' /tmp/o | sed 's/,.*//; s/^ *//')"
    done
}
db_runs "${DB_PREFIX:-db}"
