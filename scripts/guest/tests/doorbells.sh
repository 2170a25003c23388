# shellcheck shell=dash
# Shadow doorbells: the host reads the server's counters at the marks and
# computes trapped doorbell writes per I/O over each fio run (see guest-tests.sh).
# fio 4k randread on NSID 1, 2 s each, at QD 64 (checked by the host) and QD 16
# and 1 (reported).
for qd in 64 16 1; do
    sleep 1
    mark "db-qd$qd-start" 0
    fio --filename="$D1" --ioengine="$ENGINE" --direct=1 --rw=randread --bs=4k \
        --iodepth=$qd --runtime=2 --time_based --norandommap --randrepeat=0 --name=db \
        --eta=never >/tmp/o 2>&1 || { t_fail "doorbell run QD$qd: fio"; tail -n 10 /tmp/o; }
    mark "db-qd$qd-end"
    echo "doorbell run QD$qd: $(grep -E '^ +read:' /tmp/o | sed 's/,.*//; s/^ *//')"
done
