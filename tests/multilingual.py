# ruff: noqa: RUF001  (the prompts hold CJK punctuation, which is the point)
"""Prompts in several languages and code, for the prompt-length estimate and the simulator's CJK counting.

Written for these tests (no outside corpus): prose of a few registers (news, technical, conversational, an
agent's instructions) in Chinese, Japanese, Korean and English, and Python and JSON code.
"""

from __future__ import annotations

ZH = (
    "近年来，随着大语言模型在各行各业的广泛应用，如何高效地部署和调度推理服务成为了工程团队面临的核心问题。"
    "一个典型的多智能体应用往往同时调用多个模型：小模型负责意图识别和工具选择，大模型负责复杂推理和长文本生成。"
    "如果所有请求都被平均分配到每一台服务器上，短请求会被排在长请求后面，首字延迟明显变长，用户体验随之下降。",
    "请你扮演一名资深的数据分析师。我会给你一份销售报表，其中包含过去十二个月每个地区的销售额、退货率和客户满意度。"
    "请先总结整体趋势，然后找出表现最差的三个地区，并分别分析可能的原因。最后，请给出三条具体可行的改进建议，"
    "每条建议不超过五十个字，并说明预期效果以及需要哪些部门配合。回答时请使用简洁的中文，不要使用英文缩写。",
    "今天早上我去菜市场买菜，发现西红柿比上周贵了不少，老板说是因为最近连续下雨，运输成本上涨了。"
    "我顺便买了一些鸡蛋、青菜和豆腐，打算中午做一个西红柿炒鸡蛋，再煮一锅青菜豆腐汤。"
    "回家的路上碰到了楼下的王阿姨，她告诉我小区下个月要进行电梯改造，施工期间大家只能走楼梯了。",
    "北京时间昨天晚上，国家统计局发布了最新的经济数据。数据显示，今年前三个季度国内生产总值同比增长百分之五左右，"
    "其中消费对经济增长的贡献率继续保持在较高水平。专家认为，虽然外部环境依然复杂，但国内市场需求正在逐步恢复，"
    "制造业投资和基础设施建设也保持了稳定增长。下一阶段，政策重点将放在扩大内需、稳定就业和促进科技创新上。",
    "在分布式系统中，缓存一致性是一个经典难题。当多个节点同时读写同一份数据时，如果没有合适的同步机制，"
    "就可能出现脏读、丢失更新等问题。常见的解决方案包括写穿透、写回以及基于租约的失效通知。"
    "选择哪一种方案，需要综合考虑系统的读写比例、对延迟的敏感程度以及可以接受的数据不一致时间窗口。",
    "春天来了，公园里的桃花和樱花都开了，粉红色的花瓣随风飘落，像下了一场温柔的雨。"
    "孩子们在草地上放风筝、追蝴蝶，老人们坐在长椅上晒太阳、聊家常。湖面上有几只小船慢慢划过，"
    "远处传来阵阵笑声。这样的景色让人忘记了工作的疲惫，也让人更加珍惜和家人朋友在一起的时光。",
)

JA = (
    "最近、大規模言語モデルを使ったアプリケーションが急速に増えています。特に複数のエージェントが協力して"
    "作業を進める仕組みでは、小さなモデルと大きなモデルを使い分けることで、応答時間とコストのバランスを取ることが"
    "できます。しかし、すべてのリクエストを同じサーバーに送ると、待ち時間が長くなってしまいます。",
    "あなたは親切な旅行アシスタントです。来月、家族四人で京都に三泊四日の旅行を計画しています。子どもは八歳と"
    "五歳です。お寺や神社だけでなく、子どもが楽しめる場所も含めて、一日ごとのおすすめのスケジュールを作って"
    "ください。移動は電車とバスを使う予定です。予算はできるだけ抑えたいと思っています。",
)

KO = (
    "최근 대규모 언어 모델을 활용한 서비스가 빠르게 늘어나고 있습니다. 여러 에이전트가 함께 일하는 구조에서는 "
    "작은 모델과 큰 모델을 상황에 맞게 나누어 사용하면 응답 속도와 비용을 동시에 줄일 수 있습니다. 하지만 모든 "
    "요청을 같은 서버로 보내면 대기 시간이 길어지고 사용자 경험이 나빠집니다.",
    "당신은 친절한 요리 도우미입니다. 냉장고에 달걀, 두부, 김치, 양파, 그리고 약간의 돼지고기가 있습니다. "
    "삼십 분 안에 만들 수 있는 저녁 메뉴 두 가지를 추천해 주시고, 각각의 재료 손질 방법과 조리 순서를 자세히 "
    "알려 주세요. 매운 음식을 잘 못 먹는 아이도 함께 먹을 예정입니다.",
)

EN = (
    "In recent years, as large language models have spread across industries, deploying and scheduling inference "
    "efficiently has become a core problem for engineering teams. A typical multi-agent application calls several "
    "models at once: a small one picks intents and tools, a large one reasons and writes long answers. If every "
    "request is spread evenly over the servers, short requests queue behind long ones and the time to first token "
    "grows, which users notice at once.",
    "You are a senior data analyst. I will give you a sales report with each region's revenue, return rate and "
    "customer satisfaction over the past twelve months. First summarise the overall trend, then find the three "
    "regions that did worst and analyse the likely causes of each. Finally give three concrete recommendations of "
    "at most fifty words each, with the expected effect and the departments whose help they need.",
    "This morning I went to the market and noticed tomatoes cost quite a bit more than last week; the stall owner "
    "said the rain had pushed transport costs up. I also bought eggs, greens and tofu, planning scrambled eggs with "
    "tomatoes for lunch and a pot of tofu soup. On the way home I met Mrs Wang from downstairs, who told me the "
    "lifts in our building will be replaced next month, so we will all be taking the stairs for a while.",
    "Cache coherence is a classic problem in distributed systems. When several nodes read and write the same data "
    "without a suitable synchronisation mechanism, dirty reads and lost updates follow. Common remedies include "
    "write-through, write-back and lease-based invalidation; which to choose depends on the read/write ratio, how "
    "sensitive the system is to latency, and how long a window of inconsistency it can accept.",
)

CODE = (
    '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping [start, end] intervals; the result is sorted by start."""
    if not intervals:
        return []
    intervals = sorted(intervals)
    merged = [intervals[0]]
    for start, end in intervals[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]
''',
    """{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
 "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1,
 "maximum": 14}}, "required": ["city"]}}}
""",
    """import asyncio
import httpx


async def fetch_all(urls: list[str], limit: int = 8) -> dict[str, int]:
    sem = asyncio.Semaphore(limit)
    async with httpx.AsyncClient(timeout=10.0) as client:
        async def one(url: str) -> tuple[str, int]:
            async with sem:
                r = await client.get(url)
                return url, r.status_code
        results = await asyncio.gather(*(one(u) for u in urls))
    return dict(results)
""",
)

# Chinese around code, as a developer asks for help.
ZH_CODE = (
    "下面这段 Python 代码在处理大文件时速度很慢，请帮我分析原因并给出优化后的版本，同时解释每一处修改的理由：\n"
    + CODE[0]
    + "\n另外，如果区间的数量达到一千万个，内存占用大概是多少？有没有办法进一步降低？",
)

LANGUAGES: dict[str, tuple[str, ...]] = {"zh": ZH, "ja": JA, "ko": KO, "en": EN, "code": CODE, "zh+code": ZH_CODE}
