build/common/log.o: common/log.c common/log.h common/err.h
common/log.h:
common/err.h:
