build/common/json.o: common/json.c common/json.h common/buf.h \
 common/err.h
common/json.h:
common/buf.h:
common/err.h:
