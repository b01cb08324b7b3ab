/* Clocks: monotonic milliseconds for deadlines and uptime, Unix-epoch milliseconds for timestamps users read. */
#ifndef PD_CLOCK_H
#define PD_CLOCK_H

#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC: never jumps, so deadlines and durations use it. */
uint64_t pd_clock_ms(void);

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): for stored timestamps such as a dataset's creation. */
int64_t pd_clock_unix_ms(void);

#endif
