# shellcheck shell=dash
# The 64-bit guard protection information format (NVM Extended LBA Formats),
# PI64_DEV: 16 bytes of metadata per 512-byte block holding type 1 protection
# information with a CRC-64/NVME guard and a 48-bit reference tag (vnvme
# ms=16:pi=1:guard=64, QEMU ms=16,pi=1,pif=2). Linux finds the guard format in
# Identify CNS 05h (CTRATT.ELBAS), and its integrity layer then generates and
# verifies CRC-64 protection information. Checked: what Linux and nvme-cli see of
# the format, fio with verify through it, nvme copy with descriptor format 1h and
# PRINFOR/PRINFOW, and a block whose guard is made wrong through passthrough
# failing its read with the guard check error, then good again once rewritten.
dev=${PI64_DEV#/dev/}
integ=/sys/block/$dev/integrity
t_eq "$PI64_DEV: integrity format, interval, generate and verify" \
    "$(cat $integ/format 2>&1) $(cat $integ/protection_interval_bytes 2>&1) $(cat $integ/write_generate 2>&1) $(cat $integ/read_verify 2>&1)" \
    "EXT-DIF-TYPE1-CRC64 512 1 1"
if nvme id-ctrl "$PI64_DEV" >/tmp/p64c 2>&1; then
    t_eq "nvme id-ctrl: CTRATT bit 15 (extended LBA formats)" "$(($(field ctratt </tmp/p64c) >> 15 & 1))" 1
else
    t_fail "nvme id-ctrl $PI64_DEV: $(tail -2 /tmp/p64c)"
fi
if nvme id-ns "$PI64_DEV" >/tmp/p64 2>&1; then
    t_eq "nvme id-ns: dps, the format in use (16 bytes of metadata, 512 of data)" \
        "$(field dps </tmp/p64) $(grep '(in use)' /tmp/p64 | sed -n 's/.*ms:\([0-9]*\) *lbads:\([0-9]*\).*/\1+\2/p')" \
        "0x1 16+9"
else
    t_fail "nvme id-ns $PI64_DEV: $(tail -2 /tmp/p64)"
fi
# The NVM command set's own Identify Namespace (CNS 05h): PIF 2 (64b guard), no
# storage tag, for the format in use.
if nvme nvm-id-ns "$PI64_DEV" >/tmp/p64n 2>&1; then
    got=$(grep -i 'in use' /tmp/p64n | sed -n 's/.*pif:\([0-9]*\) *[a-z]*:\([0-9]*\).*/\1 \2/p')
    t_eq "nvme nvm-id-ns: the format in use has pif 2, sts 0 ($(grep -i 'in use' /tmp/p64n | tr -s ' '))" \
        "$got" "2 0"
else
    t_fail "nvme nvm-id-ns $PI64_DEV: $(tail -2 /tmp/p64n)"
fi
fio_verified "64-bit guard: fio randwrite 4K-64K QD 8, crc32c verify, through the integrity layer" \
    --filename="$PI64_DEV" --ioengine="$ENGINE" --direct=1 --rw=randwrite --bsrange=4k-64k --iodepth=8 \
    --size=8M --verify=crc32c --verify_fatal=1 --name=pi64
# Copy with descriptor format 1h (40-byte entries): blocks fio wrote, their guard
# and application tag checked and the PI stripped at the source, new PI at the
# destination, read back good through the integrity layer. Format 0h is refused
# on this format. (No reference check at the source: the guest's libnvme 1.3
# puts only the low byte of a format 1h entry's expected reference tag in its
# ELBT, which later libnvme fixed; the unit tests check ELBT.)
csrc=1024 cdst=$((PI64_LBA + 128))
if nvme copy "$PI64_DEV" --sdlba=$cdst --slbs=$csrc --blocks=7 --format=1 --prinfor=14 --prinfow=15 \
    --ref-tag=$cdst >/tmp/o 2>&1 &&
    dd if="$PI64_DEV" of=/tmp/cpd bs=4096 count=1 skip=$((cdst / 8)) iflag=direct 2>>/tmp/o &&
    dd if="$PI64_DEV" of=/tmp/cps bs=4096 count=1 skip=$((csrc / 8)) iflag=direct 2>>/tmp/o &&
    cmp -s /tmp/cps /tmp/cpd; then
    t_pass "nvme copy --format=1 --prinfor=14 --prinfow=15: checked, new PI at the destination, read back good"
else
    t_fail "nvme copy --format=1 with PRINFOR/PRINFOW: $(tail -3 /tmp/o | tr '\n' ' ')"
fi
if nvme copy "$PI64_DEV" --sdlba=$((cdst + 8)) --slbs=$csrc --blocks=7 --format=0 >/tmp/o 2>&1; then
    t_fail "nvme copy --format=0 on a 64-bit guard format succeeded"
else
    t_pass "nvme copy --format=0 on the 64-bit guard format: refused: $(grep -io 'invalid[^(]*' /tmp/o | head -1)"
fi
# A block whose guard is wrong: written through passthrough with no checks asked
# (its 16 bytes of metadata given: a guard of 8 bytes of 5Ah, application tag 0,
# reference tag the LBA), then read through the block layer, which asks the
# controller for the guard check.
blba=$((PI64_LBA + 256))
dd if=/dev/urandom of=/tmp/p64d bs=512 count=1 2>/dev/null
printf '\132\132\132\132\132\132\132\132\000\000' >/tmp/p64m
printf "$(printf '\\%03o\\%03o\\%03o\\%03o\\%03o\\%03o' 0 0 $((blba >> 24 & 255)) $((blba >> 16 & 255)) \
    $((blba >> 8 & 255)) $((blba & 255)))" >>/tmp/p64m
before=$(dmesg | wc -l)
if nvme write "$PI64_DEV" --start-block=$blba --block-count=0 --data-size=512 --data=/tmp/p64d \
    --metadata-size=16 --metadata=/tmp/p64m >/tmp/o 2>&1; then
    if dd if="$PI64_DEV" of=/dev/null bs=512 count=1 skip=$blba iflag=direct 2>/tmp/o; then
        t_fail "a block with a wrong 64-bit guard read as good data"
    else
        t_pass "a block with a wrong 64-bit guard fails its read: $(tail -1 /tmp/o | sed 's/.*: //')"
    fi
    if dmesg | tail -n +$((before + 1)) | grep -qiE "sc 0x82|guard check"; then
        t_pass "guest kernel log names the guard check: $(dmesg | tail -n +$((before + 1)) | grep -iE 'sc 0x82|guard check' | head -1 | sed 's/^\[[ 0-9.]*\] //')"
    else
        t_fail "guest kernel log: no guard check error after the bad block's read"
        dmesg | tail -n +$((before + 1)) | tail -5
    fi
else
    t_fail "nvme write with 16 bytes of metadata at LBA $blba: $(tail -2 /tmp/o)"
fi
if dd_write /tmp/p64d "$PI64_DEV" 512 $blba >/tmp/o 2>&1 &&
    dd if="$PI64_DEV" of=/tmp/p64d.back bs=512 count=1 skip=$blba iflag=direct 2>/tmp/o &&
    cmp -s /tmp/p64d /tmp/p64d.back; then
    t_pass "the bad block rewritten through the block layer reads back good"
else
    t_fail "the bad block rewritten: $(tail -2 /tmp/o)"
fi
