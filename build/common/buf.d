build/common/buf.o: common/buf.c common/buf.h common/err.h
common/buf.h:
common/err.h:
